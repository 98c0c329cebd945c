"""The durable queue: runs wait as rows; claiming one is a single atomic UPDATE.

The claim works the same on SQLite (one writer at a time) and PostgreSQL (the candidate row
is locked with SKIP LOCKED), so several service processes on one database never execute
the same run twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psutil
from sqlalchemy import ColumnElement, case, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session, aliased

from service.db.models import Run, RunEvent, utcnow
from service.runs.state import ACTIVE, Status, transition


def key_used(session: Session, idempotency_key: str) -> bool:
    """Whether a run was queued with this (caller-scoped) Idempotency-Key."""
    return session.scalar(select(Run.id).where(Run.idempotency_key == idempotency_key)) is not None


def enqueue(
    session: Session,
    *,
    profile: str,
    trigger: str,
    triggered_by: str,
    labels: Mapping[str, str],
    overrides: Mapping[str, Any],
    arms: list[dict[str, Any]],
    max_attempts: int,
    expect: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    triggered_by_token_id: int | None = None,
    profile_snapshot: Mapping[str, Any] | None = None,
) -> tuple[Run, bool]:
    """Queue a run; with an idempotency key already used, return that run instead (created=False).

    `profile_snapshot` (service.runs.admission) is the profile the run executes, whatever its
    YAML says by then."""
    if idempotency_key:
        existing = session.scalar(select(Run).where(Run.idempotency_key == idempotency_key))
        if existing is not None:
            return existing, False
    run = Run(
        profile=profile,
        status=Status.QUEUED.value,
        trigger=trigger,
        triggered_by=triggered_by,
        labels=dict(labels),
        overrides=dict(overrides),
        profile_snapshot=dict(profile_snapshot) if profile_snapshot is not None else None,
        arms=list(arms),
        expect=dict(expect) if expect else None,
        max_attempts=max_attempts,
        idempotency_key=idempotency_key,
        triggered_by_token_id=triggered_by_token_id,
    )
    session.add(run)
    try:
        session.flush()
    except IntegrityError:
        # Another request with the same key won the race; its row is the answer.
        session.rollback()
        existing = session.scalar(select(Run).where(Run.idempotency_key == idempotency_key))
        if existing is None:
            raise
        return existing, False
    session.add(RunEvent(run_id=run.id, kind="status:queued", message=f"queued by {triggered_by} ({trigger})"))
    return run, True


def in_turn() -> tuple[ColumnElement[Any] | InstrumentedAttribute[int], ...]:
    """The order queued runs start in: callers take turns. The caller (`triggered_by`: a token's
    name, a schedule, the CLI) whose last run started longest ago, or never, goes first, with its
    oldest queued run; so one caller's backlog of 500 runs never holds another's next run back."""
    earlier = aliased(Run)
    last_start = select(func.max(earlier.started_at)).where(earlier.triggered_by == Run.triggered_by).scalar_subquery()
    return case((last_start.is_(None), 0), else_=1), last_start, Run.id


def claim_next(session: Session, worker_id: str, run_id: int | None = None) -> Run | None:
    """Atomically take the next queued run in turn (`in_turn`), or run `run_id`, for `worker_id`;
    None if there is none."""
    candidate = select(Run.id).where(Run.status == Status.QUEUED.value).order_by(*in_turn()).limit(1)
    if run_id is not None:
        candidate = candidate.where(Run.id == run_id)
    if session.get_bind().dialect.name == "postgresql":
        candidate = candidate.with_for_update(skip_locked=True)
    claimed = session.execute(
        update(Run)
        .where(Run.id == candidate.scalar_subquery(), Run.status == Status.QUEUED.value)
        .values(worker_id=worker_id, heartbeat_at=utcnow())
        .returning(Run.id)
    ).scalar_one_or_none()
    if claimed is None:
        return None
    run = session.get(Run, claimed)
    assert run is not None
    session.refresh(run)
    transition(session, run, Status.STARTING_ENGINE, f"claimed by {worker_id}")
    return run


def _why_gone(run: Run, host: str, stale_after_s: float) -> str | None:
    """Why the run's worker counts as gone (its process ended on this host, or it has been silent
    for too long anywhere), or None while it lives."""
    owner_host, _, rest = (run.worker_id or "").partition(":")
    pid = rest.partition(":")[0]
    if owner_host == host and pid.isdigit() and not psutil.pid_exists(int(pid)):
        return f"its process {pid} is gone"
    if run.heartbeat_at is None:
        return "it never sent a heartbeat"
    silent_s = (utcnow() - run.heartbeat_at).total_seconds()
    return f"no heartbeat for {silent_s:.0f} s" if silent_s > stale_after_s else None


def interrupt(session: Session, run: Run, note: str) -> None:
    """A run whose executor went away: interrupted, then queued again while attempts remain."""
    transition(session, run, Status.INTERRUPTED, note)
    if run.attempt < run.max_attempts:
        transition(session, run, Status.QUEUED, f"re-queued (attempt {run.attempt} of {run.max_attempts})")
    else:
        run.error = f"interrupted {run.attempt} times; giving up"
        transition(session, run, Status.ERROR, run.error)


def recover(session: Session, *, host: str, stale_after_s: float) -> list[int]:
    """Re-queue active runs whose worker died (this host: pid gone; anywhere: heartbeat stale).

    Each becomes `interrupted`, then `queued` again while attempts remain, else `error`.
    Stored samples stay: the next attempt reuses them.
    """
    active = session.scalars(select(Run).where(Run.status.in_([s.value for s in ACTIVE]))).all()
    recovered = []
    for run in active:
        why = _why_gone(run, host, stale_after_s)
        if why is None:
            continue
        interrupt(session, run, f"worker {run.worker_id} stopped during the run ({why})")
        recovered.append(run.id)
    return recovered


def request_cancel(session: Session, run: Run, by: str) -> None:
    """Queued runs end at once; active ones are flagged and the worker stops them."""
    if run.status == Status.QUEUED.value:
        transition(session, run, Status.CANCELLED, f"cancelled by {by} before it started")
    elif run.status in {s.value for s in ACTIVE}:
        run.cancel_requested = True
        session.add(RunEvent(run_id=run.id, kind="cancel_requested", message=f"by {by}"))
