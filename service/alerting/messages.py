"""What a finished run has to say: failed, errored, passed with a warning (a metric's `warn`:
drift beyond the floor within the margin), or a metric's verdict moved since the last run; for a
run with expectations (`expect`), only whether its arms did what was expected, and errors.

"The last run" is the latest earlier run of the same profile that reached a verdict (passed
or failed); runs that errored or were cancelled have no verdicts to compare with.

Slack reads `<...>` in a message as a control sequence (`<!channel>` pings everyone,
`<https://a|b>` shows a link as other text), so the text Slack webhooks get has every value
the message quotes (labels, profile, error, explanations) escaped by Slack's rules.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from evals import suites as suite_registry
from service.arms import describe_outcome
from service.db.models import Run, SuiteResult
from service.runs.state import Status

Kind = Literal["run_failed", "run_error", "run_warned", "verdict_changed", "run_unexpected"]
JUDGED = (Status.PASSED.value, Status.FAILED.value)
MAX_ERROR_CHARS = 600


class MetricVerdict(BaseModel):
    arm: str
    suite: str
    metric: str
    value: float
    shown: str = Field(description="The value as its metric's kind writes it, e.g. `not finite`")
    verdict: str
    previous_verdict: str | None
    changed: bool
    explanation: str


class RunRef(BaseModel):
    id: int
    profile: str
    status: str
    verdict: str | None
    outcome: str | None = None
    trigger: str
    labels: dict[str, str]
    finished_at: datetime | None
    url: str


class AlertMessage(BaseModel):
    """The generic webhook body; Slack-compatible webhooks get only its `text`."""

    kind: Kind
    text: str
    run: RunRef
    summary: str
    error: str
    previous_run_id: int | None
    metrics: list[MetricVerdict]
    slack_text: str = Field(exclude=True, description="`text` with every quoted value escaped for Slack")


def slack_escape(value: str) -> str:
    """Slack's escaping: `&`, `<` and `>` as entities, so a value is shown, never obeyed."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _as_is(value: str) -> str:
    return value


def _verdicts(session: Session, run_id: int) -> dict[tuple[str, str, str], SuiteResult]:
    rows = session.scalars(select(SuiteResult).where(SuiteResult.run_id == run_id, SuiteResult.verdict.is_not(None)))
    return {(r.arm, r.suite, r.metric): r for r in rows}


def previous_judged_run(session: Session, run: Run) -> Run | None:
    return session.scalar(
        select(Run)
        .where(Run.profile == run.profile, Run.id < run.id, Run.status.in_(JUDGED))
        .order_by(Run.id.desc())
        .limit(1)
    )


def _line(m: MetricVerdict, previous_run_id: int | None, quote: Callable[[str], str]) -> str:
    was = f" (was {quote(m.previous_verdict or '')} in run {previous_run_id})" if m.changed else ""
    name = quote(f"{m.suite}.{m.metric}")
    return f"• {name} = {m.shown}: {quote(m.verdict)}{was}. {quote(m.explanation)}".rstrip()


def _text(
    run: Run,
    headline: str,
    metrics: list[MetricVerdict],
    previous_run_id: int | None,
    run_url: str,
    quote: Callable[[str], str],
) -> str:
    """The message's lines; `quote` is applied to every value that comes from a run or a caller."""
    labels = ", ".join(f"{k}={v}" for k, v in sorted((run.labels or {}).items()))
    context = quote(run.trigger + ("; " + labels if labels else ""))
    lines = [f"kvcanary: run {run.id} of {quote(run.profile)} {headline} [{context}]"]
    if run.error:
        lines.append(f"error: {quote(run.error[:MAX_ERROR_CHARS])}")
    if run.outcome:
        lines.append(quote(describe_outcome(run.expect, run.arm_verdicts or {})))
    shown = [m for m in metrics if m.changed or m.verdict != "pass"] or metrics
    lines += [_line(m, previous_run_id, quote) for m in shown]
    lines.append(quote(run_url))
    return "\n".join(lines)


def compose(session: Session, run: Run, run_url: str) -> AlertMessage | None:
    """The alert a finished run warrants, or None when it passed with no warning and every verdict as before."""
    previous = previous_judged_run(session, run)
    before = _verdicts(session, previous.id) if previous else {}
    metrics = []
    for key, row in sorted(_verdicts(session, run.id).items()):
        was = before[key].verdict if key in before else None
        metrics.append(
            MetricVerdict(
                arm=row.arm,
                suite=row.suite,
                metric=row.metric,
                value=row.value,
                shown=suite_registry.shown(row.suite, row.metric, row.value, row.details),
                verdict=row.verdict or "",
                previous_verdict=was,
                changed=was is not None and was != row.verdict,
                explanation=row.explanation,
            )
        )
    kind: Kind
    if run.status == Status.ERROR.value:
        kind, headline = "run_error", "ended in ERROR (harness or engine broke; not an accuracy verdict)"
    elif run.outcome == "unexpected":
        kind, headline = "run_unexpected", "did NOT do what was expected of its arms"
    elif run.expect:
        return None  # its arms did what was expected, a fail included: the gate saw what it should
    elif run.status == Status.FAILED.value:
        kind, headline = "run_failed", "FAILED its accuracy gate"
    elif run.status == Status.PASSED.value and any(m.verdict == "warn" for m in metrics):
        kind, headline = "run_warned", "passed with a warning: drift beyond the floor, within the margin"
    elif run.status == Status.PASSED.value and any(m.changed for m in metrics):
        kind, headline = "verdict_changed", "passed, but a metric's verdict changed since the previous run"
    else:
        return None
    previous_id = previous.id if previous else None
    return AlertMessage(
        kind=kind,
        text=_text(run, headline, metrics, previous_id, run_url, _as_is),
        slack_text=_text(run, headline, metrics, previous_id, run_url, slack_escape),
        run=RunRef(
            id=run.id,
            profile=run.profile,
            status=run.status,
            verdict=run.verdict,
            outcome=run.outcome,
            trigger=run.trigger,
            labels=run.labels or {},
            finished_at=run.finished_at,
            url=run_url,
        ),
        summary=run.verdict_summary,
        error=run.error,
        previous_run_id=previous_id,
        metrics=metrics,
    )
