"""One reading of durations (`service.durations`): `90d`, `12h`, `30m`; errors name the value."""

from __future__ import annotations

from datetime import timedelta

import pytest

from service.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "lifetime"),
    [("90d", timedelta(days=90)), ("12h", timedelta(hours=12)), ("30m", timedelta(minutes=30)),
     (" 1d ", timedelta(days=1)), ("3650d", timedelta(days=3650)), ("87600h", timedelta(days=3650))],
)  # fmt: skip
def test_whole_numbers_with_a_unit_are_durations(text: str, lifetime: timedelta) -> None:
    assert parse_duration(text, "--expires-in") == lifetime


@pytest.mark.parametrize("text", ["soon", "90", "d", "0d", "-1d", "1.5h", "90D", "90s", "١٢h", ""])
def test_anything_else_is_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=rf"^--expires-in '{text}' is not a duration: .* e\.g\. 90d, 12h or 30m"):
        parse_duration(text, "--expires-in")


def test_a_lifetime_past_ten_years_is_refused_before_it_overflows() -> None:
    with pytest.raises(ValueError, match=r"^expires_in '3651d' is longer than 3650d"):
        parse_duration("3651d", "expires_in")
    with pytest.raises(ValueError, match=r"longer than 3650d"):
        parse_duration("99999999999999999999d", "expires_in")  # timedelta itself would overflow
