"""The run state machine: the one place that changes a run's status.

queued -> starting_engine -> running -> scoring -> passed | failed, plus error (the harness
or engine broke), cancelled, and interrupted (the service died; re-queued on restart).
The client reads `Status` and `FINAL` too, so the database layer is imported only to move a run.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from service.db.models import Run


class Status(StrEnum):
    QUEUED = "queued"
    STARTING_ENGINE = "starting_engine"
    RUNNING = "running"
    SCORING = "scoring"
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


ACTIVE = frozenset({Status.STARTING_ENGINE, Status.RUNNING, Status.SCORING})
FINAL = frozenset({Status.PASSED, Status.FAILED, Status.ERROR, Status.CANCELLED})

ALLOWED: dict[Status, frozenset[Status]] = {
    Status.QUEUED: frozenset({Status.STARTING_ENGINE, Status.CANCELLED}),
    Status.STARTING_ENGINE: frozenset({Status.RUNNING, Status.ERROR, Status.CANCELLED, Status.INTERRUPTED}),
    Status.RUNNING: frozenset({Status.SCORING, Status.ERROR, Status.CANCELLED, Status.INTERRUPTED}),
    Status.SCORING: frozenset({Status.PASSED, Status.FAILED, Status.ERROR, Status.INTERRUPTED}),
    Status.INTERRUPTED: frozenset({Status.QUEUED, Status.ERROR}),
    Status.PASSED: frozenset(),
    Status.FAILED: frozenset(),
    Status.ERROR: frozenset(),
    Status.CANCELLED: frozenset(),
}


class InvalidTransition(RuntimeError):
    pass


def transition(session: Session, run: Run, new: Status, message: str = "") -> None:
    """Move `run` to `new` if the machine allows it, stamping times and an event row."""
    from service.db.models import RunEvent, utcnow

    old = Status(run.status)
    if new not in ALLOWED[old]:
        raise InvalidTransition(f"run {run.id}: {old} -> {new} is not allowed")
    now = utcnow()
    run.status = new.value
    if new == Status.STARTING_ENGINE:
        run.attempt += 1
        run.started_at = run.started_at or now
    if new in FINAL:
        run.finished_at = now
        # Kept as a number so /metrics aggregates it in SQL without parsing timestamps per run.
        run.duration_s = (now - run.started_at).total_seconds() if run.started_at else None
        run.worker_id = None
        run.engine_pid = None
    if new == Status.QUEUED:
        run.worker_id = None
        run.engine_pid = None
    session.add(RunEvent(run_id=run.id, kind=f"status:{new.value}", message=message or f"{old} -> {new}"))
