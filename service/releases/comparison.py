"""A profile's run in one release against its run in the previous one, computed once and stored.

The paired part (flips, utterances, prompts from the run diff) reads every sample of both runs:
about a second a profile at 1,319 items, so it is computed when a run that decides a release ends
(`service.releases.settled`) and stored by the pair of runs (`release_comparisons`); a read
returns it as stored. A pair nobody stored (a previous release chosen by hand) is computed on
that read. Links are stored relative and get the service's base URL when read.
"""

from __future__ import annotations

from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session

from evals import kinds
from evals import suites as suite_registry
from evals.numbers import format_signed
from service.db.models import ReleaseComparison, Run, SuiteResult, utcnow
from service.releases.schemas import Comparison, MetricChange, PairedChange
from service.runs.compare import CompareError, SuiteDiff, arms_and_suites, diff_runs


def _paired(diff_arm: str, suites: list[SuiteDiff]) -> list[PairedChange]:
    """Counts from the run diff, as each kind summarises its section (`MetricKind.changes`)."""
    return [
        PairedChange(
            arm=diff_arm, suite=suite.suite, kind=name, metric=c.metric, matched=c.matched, worse=c.worse,
            better=c.better, summary=c.summary,
        )
        for suite in suites
        for name in suite.kinds
        for c in kinds.get(name).changes(getattr(suite, name))
    ]  # fmt: skip


def _changes(session: Session, prev: Run, cur: Run) -> list[MetricChange]:
    """Each metric in both runs, its values as the metric's kind writes them."""
    ordered = (SuiteResult.arm, SuiteResult.suite, SuiteResult.id)
    rows = session.scalars(select(SuiteResult).where(SuiteResult.run_id.in_([prev.id, cur.id])).order_by(*ordered))
    before: dict[tuple[str, str, str], SuiteResult] = {}
    after: list[SuiteResult] = []
    for row in rows:
        if row.run_id == prev.id:
            before[(row.arm, row.suite, row.metric)] = row
        else:
            after.append(row)
    changes = []
    for r in after:
        old = before.get((r.arm, r.suite, r.metric))
        if old is None:
            continue
        delta = r.value - old.value
        kind = suite_registry.stored_kind(r.suite, r.metric)
        numbers = kind.plotted(old.value, old.details) is not None and kind.plotted(r.value, r.details) is not None
        changes.append(
            MetricChange(
                arm=r.arm, suite=r.suite, metric=r.metric, direction=r.direction, previous=old.value,
                current=r.value, delta=delta, worse=delta < 0 if r.direction == "higher" else delta > 0,
                previous_shown=kind.display(old.value, old.details, "-"),
                current_shown=kind.display(r.value, r.details, "-"),
                delta_shown=format_signed(delta) if numbers else "-",
            )
        )  # fmt: skip
    return changes


def compare_runs(session: Session, prev: Run, cur: Run) -> Comparison:
    """The comparison, computed (links relative to the service's base URL)."""
    stored_prev, stored_cur = arms_and_suites(session, prev.id), arms_and_suites(session, cur.id)
    several = len(stored_prev) > 1 or len(stored_cur) > 1
    arms: list[str | None] = [*sorted(set(stored_prev) & set(stored_cur))] or [None]
    paired: list[PairedChange] = []
    links: dict[str, str] = {}
    problems = []
    for arm in arms:
        try:
            diff = diff_runs(session, prev, cur, arm_a=arm, arm_b=arm, top=1)
        except CompareError as exc:
            problems.append(str(exc))
            continue
        name = diff.b.arm if arm is None else arm
        paired.extend(_paired(name, diff.suites))
        query = f"?arm_a={quote(diff.a.arm, safe='')}&arm_b={quote(diff.b.arm, safe='')}" if several else ""
        links[name] = f"/compare/{prev.id}/{cur.id}{query}"
    return Comparison(
        previous_run_id=prev.id, metrics=_changes(session, prev, cur), paired=paired, diff_links=links,
        problem="; ".join(problems),
    )  # fmt: skip


def store_comparison(session: Session, prev: Run, cur: Run) -> None:
    """Compute the pair's comparison and keep it (replacing one stored before)."""
    document = compare_runs(session, prev, cur).model_dump(mode="json")
    found = session.scalar(
        select(ReleaseComparison).where(
            ReleaseComparison.previous_run_id == prev.id, ReleaseComparison.run_id == cur.id
        )
    )
    if found is None:
        session.add(ReleaseComparison(previous_run_id=prev.id, run_id=cur.id, document=document))
    else:
        found.document, found.computed_at = document, utcnow()


def comparison_of(session: Session, prev: Run, cur: Run, base_url: str) -> Comparison:
    """The stored comparison of the pair, else computed now; links absolute under `base_url`."""
    stored = session.scalar(
        select(ReleaseComparison.document).where(
            ReleaseComparison.previous_run_id == prev.id, ReleaseComparison.run_id == cur.id
        )
    )
    found = Comparison.model_validate(stored) if stored is not None else compare_runs(session, prev, cur)
    return found.model_copy(update={"diff_links": {arm: base_url + link for arm, link in found.diff_links.items()}})
