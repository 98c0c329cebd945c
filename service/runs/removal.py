"""Deleting a run: what an admin does with a run that should not be kept (a test trigger, a row
stored before the request gate refused its labels). Shared by the API and the CLI.

Only a run that has ended can go: a queued or running run is refused (cancel it first), so no
worker or engine is still writing to a run that no longer exists, and a run a baseline holds
as its reference is refused too, so no verdict changes without a baseline edit on record. The
run's rows go with it (samples, results and events cascade), its folder is removed, and an
audit event that names it (profile, status, labels, who triggered it) stays behind.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import AuditEvent, Baseline, Run
from service.runs.state import FINAL


class RunNotFound(LookupError):
    pass


class RunInUse(RuntimeError):
    """The run cannot be deleted now; the message says what to do first."""


def delete_run(session: Session, run_id: int, actor: str) -> AuditEvent:
    """Delete run `run_id` in the caller's write transaction; its audit event, added in the same
    transaction, is returned. The folder is removed by `remove_folder` once that commits."""
    query = select(Run).where(Run.id == run_id)
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()  # a worker claiming it at this moment waits, then finds it gone
    run = session.scalar(query)
    if run is None:
        raise RunNotFound(f"run {run_id} does not exist")
    if run.status not in {s.value for s in FINAL}:
        raise RunInUse(
            f"run {run_id} is {run.status}; cancel it first (POST /api/v1/runs/{run_id}/cancel or the dashboard) "
            "and delete it once it has ended"
        )
    held = session.scalars(select(Baseline).where(Baseline.reference_run_id == run_id)).all()
    if held:
        names = ", ".join(f"{b.profile}/{b.suite}/{b.metric}" for b in held)
        raise RunInUse(f"run {run_id} is the reference of baseline {names}; promote another run or clear it first")
    detail: dict[str, Any] = {
        "profile": run.profile,
        "status": run.status,
        "verdict": run.verdict,
        "labels": run.labels or {},
        "trigger": run.trigger,
        "triggered_by": run.triggered_by,
        "created_at": run.created_at.isoformat(),
        "run_dir": run.run_dir,
    }
    event = AuditEvent(actor=actor, action="run.delete", target=f"run {run_id}", detail=detail)
    session.delete(run)
    session.add(event)
    session.flush()
    return event


def remove_folder(event: AuditEvent, runs_dir: Path) -> None:
    """The deleted run's folder (engine log, receipts), if it had one under `runs_dir`."""
    folder = Path(event.detail.get("run_dir") or "").resolve()
    if event.detail.get("run_dir") and folder.is_relative_to(runs_dir.resolve()) and folder != runs_dir.resolve():
        shutil.rmtree(folder, ignore_errors=True)
