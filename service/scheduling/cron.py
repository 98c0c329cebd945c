"""Cron arithmetic in a schedule's own time zone, answered in UTC; croniter does the parsing.

Five fields (minute resolution) as in crontab, or six where the sixth is seconds.
Imports nothing of ours, so the profile schema can validate with it too.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter


class CronError(ValueError):
    """A cron expression or time zone that cannot be used; the message says which and why."""


def _zone(timezone: str) -> ZoneInfo:
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise CronError(f"unknown time zone {timezone!r}: use an IANA name such as 'UTC' or 'Europe/Berlin'") from exc


def validate(cron: str, timezone: str) -> None:
    zone = _zone(timezone)
    if not croniter.is_valid(cron):
        raise CronError(
            f"invalid cron expression {cron!r}: five fields (minute hour day month weekday), or six with seconds"
        )
    try:
        croniter(cron, datetime.now(zone)).get_next(datetime)
    except CroniterBadDateError as exc:
        raise CronError(f"cron expression {cron!r} never fires (e.g. 30 February); pick a date that exists") from exc


def latest_due(cron: str, timezone: str, now: datetime) -> datetime:
    """The latest fire time at or before `now`: the one fire a late or restarted scheduler owes."""
    validate(cron, timezone)
    # croniter's get_prev is strictly before its start; start one whole second after `now`.
    start = now.astimezone(_zone(timezone)).replace(microsecond=0) + timedelta(seconds=1)
    due: datetime = croniter(cron, start).get_prev(datetime)
    return due.astimezone(UTC)


def next_after(cron: str, timezone: str, now: datetime) -> datetime:
    """The first fire time strictly after `now`."""
    validate(cron, timezone)
    upcoming: datetime = croniter(cron, now.astimezone(_zone(timezone))).get_next(datetime)
    return upcoming.astimezone(UTC)
