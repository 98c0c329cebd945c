"""Baselines: seeded from the profiles, changed through the API or CLI, every change kept.

The profile file is the reviewed starting point; once a row exists, the database is the
truth, so a release manager's edit is not undone by the next service start.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from evals import suites as suite_registry
from service.db.models import Baseline, BaselineChange, Run, SuiteResult, utcnow
from service.profiles import Profile
from service.runs.state import Status
from service.schemas import BaselineOut, BaselineUpdate

_FIELDS = ("value", "direction", "tolerance_kind", "tolerance", "source", "reference_run_id")


class BaselineError(ValueError):
    pass


def _snapshot(row: Baseline) -> dict[str, Any]:
    return {name: getattr(row, name) for name in _FIELDS}


def out(row: Baseline) -> BaselineOut:
    return BaselineOut.model_validate(row)


def seed_from_profiles(session: Session, profiles: dict[str, Profile]) -> int:
    """Insert baselines that profiles declare and the database does not have yet."""
    added = 0
    for profile in profiles.values():
        for suite, metrics in profile.baselines.items():
            for metric, spec in metrics.items():
                exists = session.scalar(
                    select(Baseline.id).where(
                        Baseline.profile == profile.name, Baseline.suite == suite, Baseline.metric == metric
                    )
                )
                if exists is None:
                    session.add(
                        Baseline(
                            profile=profile.name,
                            suite=suite,
                            metric=metric,
                            value=spec.value,
                            direction=spec.direction,
                            tolerance_kind=spec.tolerance.kind,
                            tolerance=spec.tolerance.value,
                            source=spec.source,
                            updated_by=f"profile {profile.name}",
                        )
                    )
                    added += 1
    return added


def list_baselines(session: Session, profile: str | None = None) -> list[BaselineOut]:
    query = select(Baseline).order_by(Baseline.profile, Baseline.suite, Baseline.metric)
    if profile:
        query = query.where(Baseline.profile == profile)
    return [out(row) for row in session.scalars(query)]


def update(session: Session, change: BaselineUpdate, by: str, profiles: dict[str, Profile]) -> BaselineOut:
    """Apply the fields given in `change`, creating the row if the profile runs that metric."""
    profile = profiles.get(change.profile)
    if profile is None:
        raise BaselineError(f"unknown profile {change.profile!r}; known: {', '.join(sorted(profiles))}")
    if change.suite not in {entry.suite for entry in profile.suites}:
        raise BaselineError(f"profile {change.profile!r} does not run suite {change.suite!r}")
    entry = next(e for e in profile.suites if e.suite == change.suite)
    declared = suite_registry.get(change.suite).metric_names(entry.config())
    if change.metric not in declared:
        raise BaselineError(
            f"suite {change.suite!r} reports no metric {change.metric!r}; it reports {', '.join(declared)}"
        )
    if change.reference_run_id is not None:
        reference = session.get(Run, change.reference_run_id)
        if reference is None or reference.profile != change.profile:
            raise BaselineError(f"run {change.reference_run_id} is not a run of profile {change.profile!r}")
        if reference.status not in (Status.PASSED.value, Status.FAILED.value):
            raise BaselineError(
                f"run {reference.id} is {reference.status}; only a finished, scored run can be a reference"
            )
    row = session.scalar(
        select(Baseline).where(
            Baseline.profile == change.profile, Baseline.suite == change.suite, Baseline.metric == change.metric
        )
    )
    if row is None:
        row = Baseline(profile=change.profile, suite=change.suite, metric=change.metric)
        session.add(row)
        before: dict[str, Any] = {}
    else:
        before = _snapshot(row)
    for name in _FIELDS:
        value = getattr(change, name)
        if name in change.model_fields_set:
            setattr(row, name, value)
    row.updated_at = utcnow()
    row.updated_by = by
    session.flush()
    session.add(
        BaselineChange(
            profile=row.profile, suite=row.suite, metric=row.metric, changed_by=by, before=before, after=_snapshot(row)
        )
    )
    return out(row)


def promote(session: Session, run_id: int, by: str, profiles: dict[str, Profile]) -> list[BaselineOut]:
    """Make a finished run the paired reference for every metric it reported."""
    run = session.get(Run, run_id)
    if run is None:
        raise BaselineError(f"run {run_id} does not exist")
    metrics = session.execute(
        select(SuiteResult.suite, SuiteResult.metric).where(SuiteResult.run_id == run_id).distinct()
    ).all()
    if not metrics:
        raise BaselineError(f"run {run_id} has no scored metrics to serve as a reference")
    return [
        update(
            session,
            BaselineUpdate(profile=run.profile, suite=suite, metric=metric, reference_run_id=run_id),
            by,
            profiles,
        )
        for suite, metric in metrics
    ]


def history(session: Session, profile: str) -> list[dict[str, Any]]:
    rows = session.scalars(
        select(BaselineChange).where(BaselineChange.profile == profile).order_by(BaselineChange.id.desc())
    )
    return [
        {
            "suite": r.suite,
            "metric": r.metric,
            "changed_at": r.changed_at.isoformat(),
            "changed_by": r.changed_by,
            "before": r.before,
            "after": r.after,
        }
        for r in rows
    ]
