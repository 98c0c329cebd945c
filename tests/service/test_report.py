"""The CLI's result table as a CI log shows it: stdout is a file there, and nothing may be cut."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from evals.numbers import format_number
from service.db.models import SuiteResult
from service.report import cli_console, metric_value, print_run, write_junit
from service.schemas import MetricOut, RunDetail

METRIC = "exact_match,strict-match-then-flexible-extract-fallback"  # a long name: the row is over 150 wide


def _run() -> RunDetail:
    metric = {
        "arm": "candidate-legacy-kernels", "suite": "gsm8k", "metric": METRIC, "value": 0.123456, "n": 1319,
        "stderr": 0.01, "ci_low": 0.101234, "ci_high": 0.145678, "direction": "higher_is_better",
        "empty_response_rate": 0.0, "baseline": 0.654321, "threshold": 0.612345, "verdict": "fail",
        "explanation": "below the threshold",
    }  # fmt: skip
    return RunDetail.model_validate({
        "id": 7, "profile": "kimi-linear-48b-a3b", "status": "failed", "verdict": "fail", "trigger": "api",
        "triggered_by": "ci", "labels": {}, "variants": [], "attempt": 1, "created_at": datetime.now(UTC),
        "started_at": None, "finished_at": None, "duration_s": None,
        "progress": {"done": 0, "total": 0, "phase": "", "eta_s": None},
        "verdict_summary": "", "error": "", "max_attempts": 1, "overrides": {}, "engine": {}, "timings": {},
        "metrics": [{**metric, "details": {}}], "log_tail": "", "links": {},
    })  # fmt: skip


def test_a_table_printed_to_a_file_keeps_every_column_whole(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    print_run(_run(), cli_console())
    out = capsys.readouterr().out
    assert "…" not in out, out
    [header] = [line for line in out.splitlines() if "baseline" in line]
    assert all(name in header for name in ("95% CI", "baseline", "threshold", "verdict")), header
    [row] = [line for line in out.splitlines() if METRIC in line and "│" in line]
    assert len(row) > 150, row  # wider than any fixed width a console might fall back to
    for number in ("0.1235", "0.1012..0.1457", "1319", "0.6543", "0.6123", "fail"):
        assert number in row, row


def test_a_terminal_width_is_still_honoured(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """$COLUMNS (a terminal's width) wins; there the table folds to fit, as rich does it."""
    monkeypatch.setenv("COLUMNS", "60")
    print_run(_run(), cli_console())
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 60


def test_a_tiny_value_keeps_its_significant_digits(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drift KL of 4e-06 nats (fixed against stock on a GPU host) is not printed as 0.0000."""
    monkeypatch.delenv("COLUMNS", raising=False)
    run = _run()
    run.metrics[0].value, run.metrics[0].ci_low, run.metrics[0].ci_high = 4.0315e-06, 0.0, 6.39e-06
    print_run(run, cli_console())
    [row] = [line for line in capsys.readouterr().out.splitlines() if METRIC in line and "│" in line]
    assert "4.032e-06" in row and "0.0000..6.39e-06" in row, row
    assert format_number(1e30) == "1e+30" and format_number(0.0) == "0.0000" and format_number(None) == "-"


def test_a_warned_drift_metric_passes_in_junit_and_shows_its_warning(tmp_path: Path) -> None:
    """`warn` (drift beyond the floor, within the margin) is no failure and no skip, yet visible:
    a verdict property on the case and on the suite, and WARNING in its output."""
    run = _run()
    run.metrics[0].verdict, run.metrics[0].suite, run.metrics[0].metric = "warn", "drift", "kl"
    junit = tmp_path / "junit.xml"
    write_junit(run, junit)
    root = ET.parse(junit).getroot()
    assert (root.get("failures"), root.get("skipped")) == ("0", "0")
    [case] = root.findall("testcase")
    assert case.find("failure") is None and case.find("skipped") is None
    assert case.find("properties/property[@name='verdict']").get("value") == "warn"  # type: ignore[union-attr]
    assert (case.findtext("system-out") or "").startswith("WARNING: drift.kl")
    warned = root.find("properties/property[@name='kvcanary.warnings']")
    assert warned is not None and warned.get("value") == "drift.kl [candidate-legacy-kernels]"


def test_a_non_finite_kl_is_shown_as_not_finite(capsys: pytest.CaptureFixture[str]) -> None:
    """The stored number of a non-finite KL is a placeholder; the service's document says what it is
    (the drift kind's display), and the CLI and JUnit print that."""
    stored = SuiteResult(
        arm="fixed", suite="drift", metric="kl", value=1e30, n=8, stderr=None, ci_low=None, ci_high=None,
        direction="lower", empty_response_rate=0.0, baseline_value=None, threshold=None, verdict="fail",
        explanation="not finite", details={"kl_finite": False},
    )  # fmt: skip
    run = _run()
    run.metrics[0] = MetricOut.of(stored)
    print_run(run, Console(width=400))
    assert "not finite" in capsys.readouterr().out
    assert metric_value(run.metrics[0]) == "not finite"
