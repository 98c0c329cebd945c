"""Render a run's result document for terminals and for CI (JUnit), from the same numbers."""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evals.numbers import format_number
from service.schemas import MetricOut, RunDetail

# Where stdout is a file or a CI log, nothing wraps lines: a table cut to 80 columns
# (`strict…`, `basel…`) loses the very numbers the log is read for.
UNWRAPPED_WIDTH = 10_000


def cli_console() -> Console:
    """The CLI's console: a terminal's width (or $COLUMNS), else lines printed whole."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=UNWRAPPED_WIDTH)


VERDICT_STYLE = {
    "pass": "green",
    "warn": "bold magenta",
    "fail": "bold red",
    "inconclusive": "yellow",
    "no_baseline": "cyan",
}


def metric_value(metric: MetricOut) -> str:
    """The metric's value as its kind writes it (the service's `shown`; from a service too old to
    send it, the plain number)."""
    return metric.shown if metric.shown is not None else format_number(metric.value)


def print_run(run: RunDetail, console: Console | None = None) -> None:
    console = console or Console()
    console.print(
        f"run {run.id} [{run.profile}] status [bold]{run.status}[/bold]"
        f"  verdict [{VERDICT_STYLE.get(run.verdict or '', 'white')}]{run.verdict or '-'}[/]"
    )
    if run.arms:
        for arm in run.arms:
            verdict = run.arm_verdicts.get(arm.name)
            wanted = f"  expected {run.expect[arm.name]}" if run.expect and arm.name in run.expect else ""
            shown = f"[{VERDICT_STYLE.get(verdict or '', 'white')}]{verdict or '-'}[/]"
            console.print(f"arm [bold]{arm.name}[/bold] (variant {arm.variant}, engine {arm.engine}): {shown}{wanted}")
    if run.expect:
        style = {"as_expected": "green", "unexpected": "bold red"}.get(run.outcome or "", "white")
        console.print(f"outcome [{style}]{run.outcome or 'not judged'}[/]  {run.outcome_summary}")
    if run.metrics:
        table = Table("arm", "suite", "metric", "value", "95% CI", "n", "baseline", "threshold", "verdict")
        for m in run.metrics:
            interval = f"{format_number(m.ci_low)}..{format_number(m.ci_high)}" if m.ci_low is not None else "-"
            table.add_row(
                m.arm,
                m.suite,
                m.metric,
                metric_value(m),
                interval,
                str(m.n),
                format_number(m.baseline),
                format_number(m.threshold),
                f"[{VERDICT_STYLE.get(m.verdict or '', 'white')}]{m.verdict or '-'}[/]",
            )
        console.print(table)
        for m in run.metrics:
            if m.explanation:
                console.print(f"[bold]{m.suite}.{m.metric}[/bold] ({m.arm}): {m.explanation}")
    if run.error:
        console.print(f"[bold red]error:[/] {run.error}")
        if run.log_tail:
            console.print("engine log tail:\n" + "\n".join(run.log_tail.splitlines()[-20:]), markup=False)


def _case(suite: ET.Element, metric: MetricOut, *, as_failure: bool) -> None:
    case = ET.SubElement(
        suite, "testcase", classname=f"kvcanary.{metric.suite}", name=f"{metric.metric} [{metric.arm}]"
    )
    message = (
        f"{metric.suite}.{metric.metric} = {metric_value(metric)} (n={metric.n}, "
        f"baseline {format_number(metric.baseline)}, threshold {format_number(metric.threshold)}): "
        f"{metric.verdict}. {metric.explanation}"
    )
    properties = ET.SubElement(case, "properties")
    ET.SubElement(properties, "property", name="verdict", value=metric.verdict or "")
    if metric.verdict == "fail" and as_failure:
        ET.SubElement(case, "failure", message=message, type="regression").text = message
    elif metric.verdict in ("inconclusive", "no_baseline"):
        ET.SubElement(case, "skipped", message=message)
    # `warn` passes: drift beyond the floor within the margin, named by the property and the output
    ET.SubElement(case, "system-out").text = ("WARNING: " if metric.verdict == "warn" else "") + message


def _expectations_case(suite: ET.Element, run: RunDetail) -> None:
    """With expectations, the run's verdict is whether its arms did what was expected: one case that
    fails when they did not (a metric's expected fail is then reported, not failed, by its own case)."""
    case = ET.SubElement(suite, "testcase", classname="kvcanary.run", name=f"expectations of run {run.id}")
    message = run.outcome_summary or f"run ended {run.status} before its arms were judged"
    if run.outcome == "unexpected":
        ET.SubElement(case, "failure", message=message, type="unexpected").text = message
    ET.SubElement(case, "system-out").text = message


def write_junit(run: RunDetail, path: Path) -> None:
    """One test case per metric, the numbers and the explanation in its message, its verdict as a
    property (a `warn` is a passing case whose output starts with WARNING, listed on the suite too);
    with expectations, one more case for them, and a metric's fail counts only through it."""
    judged = [m for m in run.metrics if m.verdict is not None]
    expected = bool(run.expect)
    failures = int(run.outcome == "unexpected") if expected else sum(m.verdict == "fail" for m in judged)
    errors = 1 if run.status in ("error", "cancelled") else 0
    suite = ET.Element(
        "testsuite",
        name=f"kvcanary.{run.profile}",
        tests=str(len(judged) + errors + int(expected)),
        failures=str(failures),
        errors=str(errors),
        skipped=str(sum(m.verdict in ("inconclusive", "no_baseline") for m in judged)),
    )
    warned = [f"{m.suite}.{m.metric} [{m.arm}]" for m in judged if m.verdict == "warn"]
    if warned:
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="kvcanary.warnings", value=", ".join(warned))
    for metric in judged:
        _case(suite, metric, as_failure=not expected)
    if expected:
        _expectations_case(suite, run)
    if errors:
        case = ET.SubElement(suite, "testcase", classname="kvcanary.run", name=f"run {run.id}")
        ET.SubElement(case, "error", message=f"run ended {run.status}: {run.error}").text = run.log_tail[-4000:]
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
