"""One number rule for every report (`evals.numbers`), and the dashboard's run page using it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from evals.numbers import format_number, format_signed
from evals.suites import shown
from service.dashboard.views import trends
from service.db.models import Run, SuiteResult
from service.db.session import session_scope
from service.settings import Settings
from tests.service.test_compare import client, settings  # noqa: F401 (fixtures)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.123456, "0.1235"),
        (0.0, "0.0000"),
        (4.0315e-06, "4.032e-06"),  # a drift KL: four significant digits, not 0.0000
        (-2.5e-05, "-2.5e-05"),
        (0.001, "0.0010"),
        (999_999.0, "999999.0000"),
        (1e30, "1e+30"),  # a non-finite drift's placeholder severity: not 31 digits
        (1234, "1234"),  # a count stays whole
        (None, "-"),
        (float("nan"), "nan"),
    ],
)
def test_numbers_keep_their_digits_without_drowning(value: float | None, shown: str) -> None:
    assert format_number(value) == shown


def test_signed_changes_and_metrics_flagged_not_finite() -> None:
    assert (format_signed(0.0125), format_signed(-3.1e-05), format_signed(0.0)) == ("+0.0125", "-3.1e-05", "0.0000")
    assert shown("drift", "kl", 1e30, {"kl_finite": False}) == "not finite"  # the drift kind's display
    assert shown("drift", "kl", 4.03e-06, {"kl_finite": True}) == "4.03e-06"
    assert shown("gsm8k", "strict-match", None, None, missing="—") == "—"
    assert shown("gone", "m", 0.5, {"kl_finite": False}) == "0.5000"  # no longer registered: a plain number
    assert format_number(1.5e-07, digits=6) == "1.5e-07" and format_number(0.5, digits=6) == "0.500000"


def test_the_run_page_shows_a_tiny_kl_and_a_huge_detail_in_their_digits(
    client: TestClient,  # noqa: F811
    settings: Settings,  # noqa: F811
) -> None:
    """The dashboard printed a KL of 4.03e-06 as 0.0000 and a detail of 1e30 as 31 digits."""
    with session_scope(settings.resolved_database_url()) as session:
        run = Run(profile="fixture", status="passed", trigger="ci", verdict="pass")
        session.add(run)
        session.flush()
        session.add(
            SuiteResult(
                run_id=run.id, arm="fixed", suite="drift", metric="kl", value=4.03e-06, ci_low=0.0, ci_high=6.39e-06,
                n=16, direction="lower", baseline_value=1.2e-06, threshold=0.0125, verdict="pass",
                explanation="within the margin", details={"kl_finite": True, "margin": 1e30},
            )
        )  # fmt: skip
        run_id = run.id
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200, page.text
    assert '<span class="value">4.03e-06</span>' in page.text, page.text
    assert "0.0000 – 6.39e-06" in page.text and "1.2e-06 / 0.0125" in page.text
    assert "1e+30" in page.text and "1000000000000000019884624838656" not in page.text
    with session_scope(settings.resolved_database_url(), write=False) as session:
        [series] = trends(session, "fixture", 10)
    [point] = series["points"]  # what the chart's hovers show
    assert (point["shown"], point["baseline_shown"], point["threshold_shown"]) == ("4.03e-06", "1.2e-06", "0.0125")
