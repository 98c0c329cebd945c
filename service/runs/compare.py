"""Run-to-run diff: per suite, the items that changed between two runs, both responses side by side.

Run `a` is the one compared against (usually the reference), run `b` the one under review.
Each run contributes one arm: the one asked for, else its treatment arm (the last arm of
an A/B run) or its only arm, the same choice scoring makes for a reference run. Comparing
two arms of one A/B run is `diff(session, run, run, arm_a="fixed", arm_b="fixed,block_size=32")`.
The item-level work is each metric kind's (`evals.kinds`), which reads the same per-item
scores for its diff as for its verdict, so the two never disagree on an item.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, create_model
from sqlalchemy import select
from sqlalchemy.orm import Session

from evals import kinds as metric_kinds
from evals import suites as suite_registry
from evals.records import Sample
from service.db.models import Run
from service.db.models import Sample as SampleRow
from service.runs.store import load_samples


class CompareError(ValueError):
    """Two runs that cannot be compared as asked; the message says which arm or suite is missing."""


class _SuiteDiffBase(BaseModel):
    """One suite's changes; each metric kind the suite declares fills the field of its name
    (`evals.kinds`: accuracy, wer, drift, invariance, mean), with the kind's own diff model."""

    suite: str
    kind: str = Field(description="The kind of the suite's first diffed metric: accuracy, wer, ...")
    kinds: list[str] = Field(description="Every metric kind with a section here, in the suite's declaration order")


if TYPE_CHECKING:
    SuiteDiff = _SuiteDiffBase
else:  # a field per registered kind, typed and documented by the kind's module
    SuiteDiff = create_model(
        "SuiteDiff",
        __base__=_SuiteDiffBase,
        **{k.name: (k.section, Field(k.empty)) for k in metric_kinds.registry().values()},
    )


class DiffSide(BaseModel):
    run_id: int
    profile: str
    arm: str
    status: str
    verdict: str | None


class RunDiff(BaseModel):
    a: DiffSide
    b: DiffSide
    suites: list[SuiteDiff]
    only_in_a: list[str] = Field(description="Suites with samples in run a's arm only")
    only_in_b: list[str] = Field(description="Suites with samples in run b's arm only")


def arms_and_suites(session: Session, run_id: int) -> dict[str, list[str]]:
    """arm -> suites that have stored samples, in name order."""
    rows = session.execute(
        select(SampleRow.arm, SampleRow.suite)
        .where(SampleRow.run_id == run_id)
        .distinct()
        .order_by(SampleRow.arm, SampleRow.suite)
    ).all()
    found: dict[str, list[str]] = {}
    for arm, suite in rows:
        found.setdefault(arm, []).append(suite)
    return found


def pick_arm(run: Run, stored: dict[str, list[str]], asked: str | None = None) -> str:
    """The arm asked for, else the treatment arm of an A/B run, else the run's only arm."""
    if asked is not None:
        if asked not in stored:
            known = ", ".join(sorted(stored)) or "none (the run stored no samples)"
            raise CompareError(f"run {run.id} has no samples for arm {asked!r}; its arms: {known}")
        return asked
    treatment = run.arms[-1]["name"] if run.arms else None
    if treatment in stored:
        return str(treatment)
    if len(stored) == 1:
        return next(iter(stored))
    if not stored:
        raise CompareError(f"run {run.id} stored no samples yet, so there is nothing to compare")
    raise CompareError(f"run {run.id} has several arms ({', '.join(sorted(stored))}); name one with arm_a/arm_b")


def _suite_diff(suite: str, a: dict[str, Sample], b: dict[str, Sample], top: int) -> SuiteDiff | None:
    """Each metric kind the suite declares diffs its own metrics; a suite no longer registered has none."""
    definition = suite_registry.registry().get(suite)
    if definition is None:
        return None
    sections: dict[str, Any] = {}
    kinds = definition.kinds()
    if not kinds and definition.open_kind is not None:  # metrics named by the profile: those the rows hold
        rows = {**a, **b}
        for name in sorted({m for k in metric_kinds.registry().values() for m in k.metrics_in(rows)}):
            kinds.setdefault(definition.open_kind(name), []).append(name)
    for kind, metrics in kinds.items():
        found = kind.diff(a, b, metrics, top)
        if found is not None:
            sections[kind.name] = found
    if not sections:
        return None
    return SuiteDiff(suite=suite, kind=next(iter(sections)), kinds=list(sections), **sections)


def diff_runs(
    session: Session, a: Run, b: Run, *, arm_a: str | None = None, arm_b: str | None = None, top: int = 50
) -> RunDiff:
    """Per suite both runs stored, what its metric kinds diff (at most `top` items per section)."""
    stored_a, stored_b = arms_and_suites(session, a.id), arms_and_suites(session, b.id)
    side_a, side_b = pick_arm(a, stored_a, arm_a), pick_arm(b, stored_b, arm_b)
    suites_a, suites_b = set(stored_a[side_a]), set(stored_b[side_b])
    suites = []
    for suite in sorted(suites_a & suites_b):
        found = _suite_diff(
            suite, load_samples(session, a.id, side_a, suite), load_samples(session, b.id, side_b, suite), top
        )
        if found is not None:
            suites.append(found)
    return RunDiff(
        a=DiffSide(run_id=a.id, profile=a.profile, arm=side_a, status=a.status, verdict=a.verdict),
        b=DiffSide(run_id=b.id, profile=b.profile, arm=side_b, status=b.status, verdict=b.verdict),
        suites=suites,
        only_in_a=sorted(suites_a - suites_b),
        only_in_b=sorted(suites_b - suites_a),
    )
