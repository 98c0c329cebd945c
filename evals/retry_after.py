"""The one reading of an HTTP `Retry-After` header, for every client kvcanary has: the suites'
requests and the alert webhooks (`evals.retry`) and `kvcanary submit` waiting out a busy service.

RFC 9110 allows delay-seconds (digits) or an HTTP date; either is read, and the wait is capped
at `MAX_RETRY_AFTER_S` so that a receiver cannot park a caller for hours (the caller's own
deadline still comes first). Standard library only: the client (`pip install kvcanary`, no
extras) imports it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

MAX_RETRY_AFTER_S = 120.0


def retry_after_s(header: str | None, now: datetime | None = None) -> float | None:
    """The wait, in seconds from `now`, that a `Retry-After` value asks for (0 for a date already
    past, at most MAX_RETRY_AFTER_S); None when there is no value or it is neither form."""
    value = (header or "").strip()
    if not value:
        return None
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # "-0000": a date in UTC whose zone the sender did not know
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)
