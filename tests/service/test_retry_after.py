"""One Retry-After rule (`evals.retry_after`) for the suites, the webhooks and `kvcanary submit`:
delay-seconds or an HTTP date, one cap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from evals.retry_after import MAX_RETRY_AFTER_S, retry_after_s
from tests.service.conftest import answer_through

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


def _date(seconds_from_now: float) -> str:
    return format_datetime(NOW + timedelta(seconds=seconds_from_now), usegmt=True)


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        ("7", 7.0),
        (" 0 ", 0.0),
        (_date(30), 30.0),  # an HTTP date: "Thu, 03 Dec 2026 12:00:30 GMT"
        (_date(-30), 0.0),  # already past: go now
        ("Thu, 03 Dec 2026 12:00:45 -0000", 45.0),  # a date in UTC without a named zone
        ("86400", MAX_RETRY_AFTER_S),  # capped: a receiver cannot park a caller for a day
        (_date(3600), MAX_RETRY_AFTER_S),
        ("", None),
        (None, None),
        ("soon", None),
        ("-5", None),  # neither digits nor a date
        ("1.5", None),
    ],
)
def test_seconds_and_dates_are_read_and_capped(header: str | None, wait: float | None) -> None:
    assert retry_after_s(header, now=NOW) == wait


def test_submit_waits_a_retry_after_given_as_a_date(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake transport: a real service answers 503 with delay-seconds only, and the client must
    read the date form a proxy in front of it may send. Beyond the cap the client waits the cap."""
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    answers = [
        httpx.Response(503, headers={"Retry-After": soon}, json={"detail": "busy"}),
        httpx.Response(429, headers={"Retry-After": "600"}, json={"detail": "slow down"}),
        httpx.Response(429, json={"detail": "slow down"}),
        httpx.Response(201, json={"id": 7}),
    ]
    response, waits = answer_through(answers, monkeypatch)
    assert response is not None and response.status_code == 201
    assert 25.0 <= waits[0] <= 30.0 and waits[1:] == [MAX_RETRY_AFTER_S, 5.0]
