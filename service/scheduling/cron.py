"""Cron arithmetic in a schedule's own time zone, answered in UTC; croniter does the arithmetic.

Five fields (minute hour day-of-month month day-of-week) as in crontab, or six where the
sixth is seconds. Each field is `*` or a comma-separated list of numbers, ranges `a-b` and
steps (`*/n`, `a-b/n`), every number within the field's range and every step no larger than
it; months and weekdays may be written as three-letter names. Nothing else: croniter also
takes a seventh (year) field, `L`, `#`, `?` and steps of any size, which this refuses before
croniter sees them. Imports nothing of ours, so the profile schema can validate with it too.
"""

from __future__ import annotations

import re
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


# Each field's name and range, in order; the sixth (seconds) only in six-field expressions.
FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
SECONDS = ("second", 0, 59)
NAMES = {
    "month": ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
    "day of week": ("sun", "mon", "tue", "wed", "thu", "fri", "sat"),
}
_ITEM = re.compile(
    r"^(?:\*|(?P<low>[0-9]{1,2}|[a-z]{3})(?:-(?P<high>[0-9]{1,2}|[a-z]{3}))?)(?:/(?P<step>[0-9]{1,3}))?$"
)
FORMS = (
    "five fields (minute hour day month weekday), or six with seconds last; "
    "each *, numbers, a-b ranges, */n or a-b/n steps"
)


def _number(text: str, name: str, low: int, high: int, where: str) -> int:
    names = NAMES.get(name, ())
    value = (
        (names.index(text) + (1 if name == "month" else 0)) if text in names else int(text) if text.isdigit() else -1
    )
    if not low <= value <= high:
        raise CronError(f"{where}: {text!r} is outside the {name} field's {low}-{high}")
    return value


def check_form(cron: str) -> None:
    """CronError unless `cron` is of the documented forms (see the module's docstring)."""
    fields = cron.lower().split()
    if len(fields) not in (5, 6):
        raise CronError(f"invalid cron expression {cron[:80]!r}: {len(fields)} fields; {FORMS}")
    for text, (name, low, high) in zip(fields, (*FIELDS, SECONDS), strict=False):
        for item in text.split(","):
            where = f"invalid cron expression {cron[:80]!r}, {name} field {text[:40]!r}"
            match = _ITEM.match(item)
            if match is None:
                raise CronError(f"{where}: {item[:40]!r} is not of the documented forms; {FORMS}")
            start = _number(match["low"], name, low, high, where) if match["low"] else low
            end = _number(match["high"], name, low, high, where) if match["high"] else high
            if end < start:
                raise CronError(f"{where}: range {item!r} runs backwards")
            if match["step"] is not None and not 1 <= int(match["step"]) <= high - low + 1:
                raise CronError(f"{where}: step {match['step']} is outside 1-{high - low + 1}, the {name} field's size")


def validate(cron: str, timezone: str) -> None:
    zone = _zone(timezone)
    check_form(cron)
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
