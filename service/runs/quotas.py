"""How much queued engine work one token, and everyone together, may have waiting.

A queued run costs a GPU host one engine load per arm (a run without arms: one), and a
48B-parameter model takes minutes to load; so a token's queued work is limited both in runs
and in engine loads (arms x runs), and all queued runs together by a global cap. A trigger
past a limit is answered 429 with Retry-After, and the message names the limit, its value and
the setting that holds it. The defaults are settings (`KVCANARY_MAX_QUEUED_...`); an admin
changes them at `/api/v1/quotas`, which keeps the change in the database for every replica.

Runs without a token (schedules, `kvcanary run` on the host) are held by the global cap only.
The order in which queued runs start is the other half of fairness: `service.runs.queue`
serves callers in turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db.models import Quota, Run, utcnow
from service.runs.state import Status
from service.settings import Settings

RETRY_AFTER_S = 60  # queued runs start minutes apart; asking again sooner would find the queue as full
# Each limit: its name (the API's and the database's) and what it bounds.
LIMITS = {
    "max_queued_runs_per_token": "queued runs one token may have at once",
    "max_queued_engine_loads_per_token": "engine loads (arms x runs) one token may have queued at once",
    "max_queued_runs": "queued runs of all tokens together",
}


class QuotaExceeded(Exception):
    """A trigger past a limit; the message names the limit, its value and where it is set."""

    retry_after_s = RETRY_AFTER_S


@dataclass(frozen=True)
class QuotaValue:
    name: str
    value: int
    default: int
    description: str
    changed_by: str | None
    changed_at: Any


def current(session: Session, settings: Settings) -> dict[str, QuotaValue]:
    """Every limit's value in force: an admin's change where there is one, else the setting."""
    changed = {row.name: row for row in session.scalars(select(Quota))}
    values = {}
    for name, description in LIMITS.items():
        default = int(getattr(settings, name))
        row = changed.get(name)
        values[name] = QuotaValue(
            name,
            row.value if row else default,
            default,
            description,
            row.changed_by if row else None,
            row.changed_at if row else None,
        )
    return values


def change(session: Session, values: Mapping[str, int], by: str) -> None:
    """Set limits (names from `LIMITS`, values >= 1, checked by the API's schema) for every replica."""
    for name, value in values.items():
        row = session.get(Quota, name)
        if row is None:
            session.add(Quota(name=name, value=value, changed_by=by, changed_at=utcnow()))
        else:
            row.value, row.changed_by, row.changed_at = value, by, utcnow()


def engine_loads(arms: list[Any]) -> int:
    """What a run costs a GPU host: one engine load per arm, one for a run without arms."""
    return max(1, len(arms))


def _refuse(who: str, count: int, unit: str, more: int, limit: QuotaValue) -> QuotaExceeded:
    return QuotaExceeded(
        f"{who} {count} {unit} queued, and this run would add {more}: over the limit {limit.name} = {limit.value} "
        f"({limit.description}; set by {limit.changed_by or 'KVCANARY_' + limit.name.upper()}); "
        f"retry after {RETRY_AFTER_S} s, when queued runs may have started, or cancel some"
    )


def enforce(session: Session, settings: Settings, token_id: int | None, token_name: str, loads: int) -> None:
    """QuotaExceeded when queuing a run of `loads` engine loads for this token passes a limit.

    Called in the write transaction that queues the run: on SQLite that transaction holds the
    write lock, so two triggers never both pass on the last free place."""
    limits = current(session, settings)
    queued = Status.QUEUED.value
    everyone = session.scalar(select(func.count()).select_from(Run).where(Run.status == queued)) or 0
    if everyone + 1 > limits["max_queued_runs"].value:
        raise _refuse("all tokens together have", everyone, "runs", 1, limits["max_queued_runs"])
    if token_id is None:
        return
    mine = session.scalars(select(Run.arms).where(Run.status == queued, Run.triggered_by_token_id == token_id)).all()
    if len(mine) + 1 > limits["max_queued_runs_per_token"].value:
        raise _refuse(f"token {token_name!r} has", len(mine), "runs", 1, limits["max_queued_runs_per_token"])
    held = sum(engine_loads(arms or []) for arms in mine)
    if held + loads > limits["max_queued_engine_loads_per_token"].value:
        limit = limits["max_queued_engine_loads_per_token"]
        raise _refuse(f"token {token_name!r} has", held, "engine loads", loads, limit)
