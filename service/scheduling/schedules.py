"""Schedules: seeded from profiles' `schedule:` blocks, changed through the API or CLI, fired once.

A schedule row named after its profile follows that profile's block at every service start
until someone changes it through the API or CLI (`overridden`); from then on the database is
the truth, as for baselines. The nightly switch (`KVCANARY_NIGHTLY`) decides whether the
blocks that say `enabled: true` are switched on in this deployment.

Firing is exactly-once across processes because the first write of a fire is its
`ScheduleFire` row, unique per (schedule, fire time): the process whose insert loses the
race to that constraint queues nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.models import Run, Schedule, ScheduleFire, utcnow
from service.db.session import session_scope
from service.profiles import Profile, ScheduleSpec
from service.runs import queue
from service.runs.admission import RunRefused, admit
from service.runs.gate_grade import SCHEDULER, stamp
from service.runs.state import ACTIVE, Status
from service.scheduling import cron
from service.scheduling.schemas import ScheduleOut, ScheduleUpdate

log = logging.getLogger(__name__)

TRIGGER = "nightly"
RECENT_FIRES = 5
# A nightly run in any of these states blocks the next fire of its profile's schedules.
UNFINISHED = frozenset({Status.QUEUED, Status.INTERRUPTED, *ACTIVE})

# What "now" is for firing: the wall clock in the service, a clock the test moves in tests.
Clock = Callable[[], datetime]


class ScheduleError(ValueError):
    """A schedule that cannot be created, changed or fired; the message says which and why."""


@dataclass(frozen=True)
class Fired:
    """What one fire did: queued `run_id`, or recorded `skipped_reason`; None from `fire` if another process won."""

    schedule: str
    fire_time: datetime
    run_id: int | None
    skipped_reason: str


def _next_fire(row: Schedule, now: datetime) -> datetime | None:
    return cron.next_after(row.cron, row.timezone, now) if row.enabled else None


def _sync_one(session: Session, name: str, spec: ScheduleSpec, nightly: bool, now: datetime) -> None:
    enabled = spec.enabled and nightly
    row = session.scalar(select(Schedule).where(Schedule.name == name))
    if row is None:
        row = Schedule(name=name, profile=name, cron=spec.cron, timezone=spec.timezone, enabled=enabled)
        session.add(row)
    elif row.overridden:
        return
    timing_changed = (row.cron, row.timezone, row.enabled) != (spec.cron, spec.timezone, enabled)
    row.cron, row.timezone, row.enabled, row.labels = spec.cron, spec.timezone, enabled, dict(spec.labels)
    if row.id is None or timing_changed or (row.enabled and row.next_fire_at is None):
        row.next_fire_at = _next_fire(row, now)


def sync_from_profiles(url: str, profiles: dict[str, Profile], nightly: bool, clock: Clock = utcnow) -> None:
    """Bring profile-defined schedules in line with the profiles; overridden rows are left alone.

    `next_fire_at` is kept while cron, zone and enabled are unchanged, so a fire missed while
    the service was down is still due at the next start (and is fired once). Each schedule is
    its own transaction: two processes starting together both create it, and one insert loses.
    """
    now = clock()
    scheduled = {name: p.schedule for name, p in profiles.items() if p.schedule is not None}
    for name, spec in scheduled.items():
        try:
            cron.validate(spec.cron, spec.timezone)
        except cron.CronError as exc:
            raise ScheduleError(f"profile {name}: schedule: {exc}") from exc
        try:
            with session_scope(url) as session:
                _sync_one(session, name, spec, nightly, now)
        except IntegrityError:
            log.info("schedule %s was created by another process at the same time", name)
    with session_scope(url) as session:
        orphans = select(Schedule).where(Schedule.overridden.is_(False), Schedule.name.not_in(list(scheduled)))
        for row in session.scalars(orphans):
            row.enabled, row.next_fire_at = False, None


def _out(session: Session, row: Schedule) -> ScheduleOut:
    fires = session.scalars(
        select(ScheduleFire)
        .where(ScheduleFire.schedule_id == row.id)
        .order_by(ScheduleFire.fire_time.desc())
        .limit(RECENT_FIRES)
    ).all()
    return ScheduleOut.of(row, list(fires))


def list_schedules(session: Session) -> list[ScheduleOut]:
    return [_out(session, row) for row in session.scalars(select(Schedule).order_by(Schedule.name))]


def _known(session: Session) -> str:
    return ", ".join(session.scalars(select(Schedule.name).order_by(Schedule.name))) or "none"


def get(session: Session, name: str) -> Schedule:
    row = session.scalar(select(Schedule).where(Schedule.name == name))
    if row is None:
        raise ScheduleError(f"no schedule named {name!r}; known schedules: {_known(session)}")
    return row


def update(session: Session, change: ScheduleUpdate, profiles: dict[str, Profile]) -> ScheduleOut:
    """Apply an API/CLI change; the row is marked overridden so profile syncs leave it alone."""
    changes = change.changes()
    if "profile" in changes and changes["profile"] not in profiles:
        raise ScheduleError(f"unknown profile {changes['profile']!r}; known profiles: {', '.join(sorted(profiles))}")
    row = session.scalar(select(Schedule).where(Schedule.name == change.name))
    if row is None:
        if change.profile is None or change.cron is None:
            raise ScheduleError(
                f"no schedule named {change.name!r} (known schedules: {_known(session)}); "
                "to create one, give at least profile and cron"
            )
        row = Schedule(
            name=change.name, profile=change.profile, cron=change.cron, timezone="UTC", enabled=False, labels={}
        )
        session.add(row)
    for field, value in changes.items():
        setattr(row, field, value)
    row.overridden = True
    try:
        row.next_fire_at = _next_fire(row, utcnow())
    except cron.CronError as exc:  # the stored cron in the newly given time zone, or the reverse
        raise ScheduleError(str(exc)) from exc
    session.flush()
    return _out(session, row)


def _blocker(session: Session, schedule: Schedule, profiles: dict[str, Profile]) -> str:
    """Why this fire must queue nothing, or "" when it may queue its run."""
    if schedule.profile not in profiles:
        return f"profile {schedule.profile!r} is not among this service's profiles; nothing was queued"
    unfinished = session.scalar(
        select(Run)
        .where(
            Run.profile == schedule.profile,
            Run.trigger == TRIGGER,
            Run.status.in_([s.value for s in UNFINISHED]),
        )
        .order_by(Run.id.desc())
        .limit(1)
    )
    if unfinished is not None:
        return f"nightly run {unfinished.id} of {schedule.profile} is still {unfinished.status}; nothing was queued"
    return ""


def _queue_run(
    session: Session, schedule: Schedule, profiles: dict[str, Profile], triggered_by: str
) -> tuple[int | None, str]:
    """Queue the fire's run: (its id, ""), or (None, why none was queued). The profile's arms; the
    schedule block's expect, else the profile's. Whether a host can run it is checked
    for every scheduled run: the worker that claims it refuses it when its host cannot run it."""
    profile = profiles[schedule.profile]
    try:
        admitted = admit(profile, None, None, profile.schedule.expect if profile.schedule else None, on_this_host=False)
    except RunRefused as exc:
        return None, f"{exc}; nothing was queued"
    run, _ = queue.enqueue(
        session,
        profile=schedule.profile,
        trigger=TRIGGER,
        triggered_by=triggered_by,
        labels={**schedule.labels, "schedule": schedule.name},
        overrides={},
        arms=admitted.plan.stored_arms(),
        expect=admitted.plan.expect,
        max_attempts=profile.max_attempts,
        profile_snapshot=admitted.snapshot(),
    )
    stamp(run, SCHEDULER, "")  # the profile's own schedule block: the profile as defined
    return run.id, ""


def fire(
    url: str,
    schedule_id: int,
    fire_time: datetime,
    profiles: dict[str, Profile],
    triggered_by: str,
    clock: Clock = utcnow,
) -> Fired | None:
    """Record the fire, then queue its run or the reason it queued none, in one transaction.

    Returns None when this fire time of this schedule was already taken (by another process).
    """
    try:
        with session_scope(url) as session:
            # The first write: the unique (schedule, fire time) key decides which process fires.
            record = ScheduleFire(schedule_id=schedule_id, fire_time=fire_time, skipped_reason="")
            session.add(record)
            session.flush()
            schedule = session.get(Schedule, schedule_id)
            assert schedule is not None, f"schedule {schedule_id} vanished while firing"
            record.skipped_reason = _blocker(session, schedule, profiles)
            if not record.skipped_reason:
                record.run_id, record.skipped_reason = _queue_run(session, schedule, profiles, triggered_by)
            if record.skipped_reason:
                _coalesce(session, record)
            schedule.last_fire_at = max(fire_time, schedule.last_fire_at or fire_time)
            schedule.next_fire_at = _next_fire(schedule, clock())
            return Fired(schedule.name, fire_time, record.run_id, record.skipped_reason)
    except IntegrityError:
        _move_past(url, schedule_id, fire_time, clock())
        return None


def _coalesce(session: Session, record: ScheduleFire) -> None:
    """Fold the fire before `record` into it when both were skipped for the same reason: a run of
    identical skips is one row (`skipped_fires` of them, from `first_fire_time`), so a schedule
    that fires every second while its last run is unfinished does not write a row a second."""
    previous = session.scalar(
        select(ScheduleFire)
        .where(ScheduleFire.schedule_id == record.schedule_id, ScheduleFire.fire_time < record.fire_time)
        .order_by(ScheduleFire.fire_time.desc())
        .limit(1)
    )
    if previous is None or previous.run_id is not None or previous.skipped_reason != record.skipped_reason:
        return
    record.skipped_fires = previous.skipped_fires + 1
    record.first_fire_time = previous.first_fire_time or previous.fire_time
    session.delete(previous)


def _move_past(url: str, schedule_id: int, fire_time: datetime, now: datetime) -> None:
    """The fire was taken; make sure this schedule's next fire lies beyond it, whoever took it."""
    with session_scope(url) as session:
        schedule = session.get(Schedule, schedule_id)
        if schedule is not None and schedule.next_fire_at is not None and schedule.next_fire_at <= fire_time:
            schedule.next_fire_at = _next_fire(schedule, max(fire_time, now))


def earliest_next_fire(url: str) -> datetime | None:
    """When the scheduler next has work, so it can wake on time rather than a tick late."""
    with session_scope(url) as session:
        return session.scalar(select(func.min(Schedule.next_fire_at)).where(Schedule.enabled.is_(True)))


def fire_due(url: str, profiles: dict[str, Profile], triggered_by: str, clock: Clock = utcnow) -> list[Fired]:
    """Fire every enabled schedule whose next fire time has passed, once, at its latest due time.

    After downtime that spanned several fire times only the latest is fired: a nightly
    evaluation owes one fresh verdict, not a backlog of identical runs.
    """
    now = clock()
    with session_scope(url) as session:
        due = session.execute(
            select(Schedule.id, Schedule.cron, Schedule.timezone).where(
                Schedule.enabled.is_(True), Schedule.next_fire_at <= now
            )
        ).all()
    fired = []
    for schedule_id, expression, timezone in due:
        outcome = fire(url, schedule_id, cron.latest_due(expression, timezone, now), profiles, triggered_by, clock)
        if outcome is not None:
            fired.append(outcome)
    return fired
