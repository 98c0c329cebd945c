"""Durations as people write them: a whole number and a unit, `90d`, `12h` or `30m`.

The one reading of them, for the CLI (`kvcanary tokens create --expires-in`) and the API
(`expires_in` of `POST /api/v1/tokens`). At most ten years, the longest token lifetime the API
takes in days too. Standard library only: the client imports the CLI.
"""

from __future__ import annotations

from datetime import timedelta

UNITS = {"d": timedelta(days=1), "h": timedelta(hours=1), "m": timedelta(minutes=1)}
LONGEST = timedelta(days=3650)
EXAMPLES = "90d, 12h or 30m"


def parse_duration(text: str, name: str) -> timedelta:
    """`text` as a timedelta; ValueError naming `name` and the value when it is none or too long."""
    value = text.strip()
    amount, unit = value[:-1], value[-1:]
    if unit not in UNITS or not (amount.isascii() and amount.isdigit()) or int(amount) == 0:
        raise ValueError(f"{name} {text!r} is not a duration: a whole number above 0 and d, h or m, e.g. {EXAMPLES}")
    if int(amount) > LONGEST // UNITS[unit]:
        raise ValueError(f"{name} {text!r} is longer than {LONGEST.days}d, the longest lifetime a token may have")
    return int(amount) * UNITS[unit]
