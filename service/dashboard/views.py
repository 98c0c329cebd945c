"""Read queries only the dashboard needs: profile overviews, metric trends, per-suite sample counts.

Each is one or two indexed queries whose size does not grow with the number of stored runs
(trends read the newest `last` runs of one profile), so pages stay fast on a large history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.orm import Session

from evals import kinds
from evals import suites as suite_registry
from evals.kinds import MetricKind
from evals.numbers import format_number
from evals.verdict import Baseline, threshold
from service.baselines import list_baselines
from service.db.models import Run, SuiteResult
from service.db.models import Sample as SampleRow
from service.schemas import BaselineOut


@dataclass(frozen=True)
class ProfileOverview:
    name: str
    runs: int
    last_run: Run | None
    loaded: bool


def profile_names(session: Session, loaded: list[str]) -> list[str]:
    """Profiles the service knows now and those only old runs remember."""
    seen = set(session.scalars(select(Run.profile).distinct()))
    return sorted(seen | set(loaded))


def profile_overviews(session: Session, loaded: list[str]) -> list[ProfileOverview]:
    counts = dict(session.execute(select(Run.profile, func.count()).group_by(Run.profile)).tuples().all())
    newest_ids = session.scalars(select(func.max(Run.id)).group_by(Run.profile)).all()
    newest = {run.profile: run for run in session.scalars(select(Run).where(Run.id.in_(newest_ids)))}
    return [
        ProfileOverview(name, counts.get(name, 0), newest.get(name), name in loaded)
        for name in sorted(set(counts) | set(loaded))
    ]


def current_threshold(baseline: BaselineOut) -> float | None:
    return threshold(Baseline.stored(baseline.value, baseline.direction, baseline.tolerance_kind, baseline.tolerance))


def _point(row: SuiteResult, run: Run) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "at": run.created_at.isoformat(),
        "arm": row.arm,
        "value": suite_registry.stored_kind(row.suite, row.metric).plotted(row.value, row.details),
        "shown": suite_registry.shown(row.suite, row.metric, row.value, row.details),
        "ci_low": row.ci_low,
        "ci_high": row.ci_high,
        "n": row.n,
        "verdict": row.verdict or "none",
        "baseline": row.baseline_value,
        "threshold": row.threshold,
        "baseline_shown": format_number(row.baseline_value),
        "threshold_shown": format_number(row.threshold),
        "git_sha": (run.labels or {}).get("git_sha", ""),
    }


def trends(session: Session, profile: str, last: int) -> list[dict[str, Any]]:
    """Per (suite, metric): the newest `last` runs' values with CIs and the baseline in force.

    The baseline and threshold stored with each result draw the band as it was when that run
    was judged; the current baseline row extends it to now.
    """
    recent = select(Run.id).where(Run.profile == profile).order_by(Run.id.desc()).limit(last).subquery()
    rows = session.execute(
        select(SuiteResult, Run)
        .join(Run, SuiteResult.run_id == Run.id)
        .where(SuiteResult.run_id.in_(select(recent.c.id)))
        .order_by(Run.created_at, Run.id)
    ).all()
    current = {(b.suite, b.metric): b for b in list_baselines(session, profile)}
    series: dict[tuple[str, str], dict[str, Any]] = {}
    for result, run in rows:
        key = (result.suite, result.metric)
        if key not in series:
            series[key] = {"suite": result.suite, "metric": result.metric, "direction": result.direction, "points": []}
        series[key]["points"].append(_point(result, run))
    for key, entry in series.items():
        baseline = current.get(key)
        entry["current"] = (
            {
                "value": baseline.value,
                "threshold": current_threshold(baseline),
                "value_shown": format_number(baseline.value),
                "threshold_shown": format_number(current_threshold(baseline)),
                "source": baseline.source,
            }
            if baseline is not None and baseline.value is not None
            else None
        )
    return [series[key] for key in sorted(series)]


@dataclass(frozen=True)
class SuiteCount:
    arm: str
    suite: str
    kind: str  # the kind whose view shows the suite's samples (`shown_kind`)
    samples: int
    wrong: int
    totals: dict[str, int | None]  # the kind's declared sums (`MetricKind.totals`); None: no sample had them


def shown_kind(suite: str) -> MetricKind:
    """The kind of the suite's primary metric picks the samples view; a suite no longer registered,
    or one whose profile names its metrics (lm-eval), is shown as items (key, prompt, response,
    flags), which every stored sample has."""
    definition = suite_registry.registry().get(suite)
    if definition is None:
        return kinds.get("accuracy")
    return definition.metrics[0].kind if definition.metrics else kinds.get("accuracy")


def sample_counts(session: Session, run_id: int) -> list[SuiteCount]:
    """Per (arm, suite): how many samples, how many wrong, and the sums its kind declares."""
    sums = {name: paths for kind in kinds.registry().values() for name, paths in kind.totals.items()}
    rows = session.execute(
        select(
            SampleRow.arm,
            SampleRow.suite,
            func.count(),
            func.sum(case((SampleRow.is_correct.is_(False), 1), else_=0)),
            *(func.sum(sum_of(paths)) for paths in sums.values()),
        )
        .where(SampleRow.run_id == run_id)
        .group_by(SampleRow.arm, SampleRow.suite)
        .order_by(SampleRow.arm, SampleRow.suite)
    ).all()
    counts = []
    for arm, suite, n, wrong, *totals in rows:
        kind = shown_kind(suite)
        found = dict(zip(sums, totals, strict=True))
        counts.append(SuiteCount(arm, suite, kind.name, n, wrong or 0, {name: found[name] for name in kind.totals}))
    return counts


def sum_of(paths: tuple[tuple[str, str], ...]) -> ColumnElement[int]:
    """`data[a][b]` summed over the paths, as an integer; NULL where a sample has none of them."""
    values = [SampleRow.data[path].as_integer() for path in paths]
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def reference_runs(session: Session, profile: str, exclude: int) -> dict[int, list[str]]:
    """Reference run id -> the suites it is the reference for (other than the run itself)."""
    found: dict[int, list[str]] = {}
    for baseline in list_baselines(session, profile):
        if baseline.reference_run_id is not None and baseline.reference_run_id != exclude:
            suites = found.setdefault(baseline.reference_run_id, [])
            if baseline.suite not in suites:
                suites.append(baseline.suite)
    return found
