"""A profile's metrics over releases (not over runs): per release, the values of the run that decides it
(its latest decided gate-grade run, as `service.releases.decision` picks it).

For the profile page's "by release" charts: what a release manager compares is 0.24.0 against
0.25.0, not nightly against nightly. Each point keeps the baseline and pass line it was judged
against, so the band shows the baseline as it was for that release.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, load_only

from evals import suites as suite_registry
from evals.numbers import format_number
from service.db.models import Run, SuiteResult
from service.releases.decision import DECIDED
from service.releases.schemas import release_path


def release_trends(session: Session, profile: str, key: str, last: int, gate_roles: Sequence[str]) -> dict[str, Any]:
    """{"key", "releases": values oldest first (by first run), "series": per (suite, metric) points}."""
    value = Run.labels[key].as_string()
    runs = session.scalars(
        select(Run)
        .where(Run.profile == profile, value.is_not(None), Run.status.in_(DECIDED), Run.exploratory == "")
        .where(Run.triggered_role.in_(gate_roles))
        .options(load_only(Run.id, Run.labels, Run.created_at, raiseload=True))
        .order_by(Run.id)
    ).all()
    first_seen: dict[str, Any] = {}
    latest: dict[str, Run] = {}
    for run in runs:
        release = str(run.labels[key])
        first_seen.setdefault(release, run.created_at)
        latest[release] = run
    releases = sorted(first_seen, key=lambda r: (first_seen[r], r))[-last:]
    run_release = {latest[r].id: r for r in releases}
    results = session.scalars(
        select(SuiteResult).where(SuiteResult.run_id.in_(run_release)).order_by(SuiteResult.suite, SuiteResult.metric)
    ).all()
    order = {r: i for i, r in enumerate(releases)}
    series: dict[tuple[str, str], dict[str, Any]] = {}
    for row in sorted(results, key=lambda r: (order[run_release[r.run_id]], r.arm)):
        new = {"suite": row.suite, "metric": row.metric, "direction": row.direction, "points": []}
        entry = series.setdefault((row.suite, row.metric), new)
        release = run_release[row.run_id]
        entry["points"].append(
            {
                "release": release,
                "link": f"/releases/{release_path(key, release)}",
                "run_id": row.run_id,
                "arm": row.arm,
                "value": row.value,
                "shown": suite_registry.shown(row.suite, row.metric, row.value, row.details),
                "ci_low": row.ci_low,
                "ci_high": row.ci_high,
                "verdict": row.verdict or "none",
                "baseline": row.baseline_value,
                "threshold": row.threshold,
                "baseline_shown": format_number(row.baseline_value),
                "threshold_shown": format_number(row.threshold),
            }
        )
    return {"key": key, "releases": releases, "series": [series[k] for k in sorted(series)]}
