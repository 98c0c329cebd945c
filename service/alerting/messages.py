"""What a finished run has to say: failed, errored, passed with a warning (a metric's `warn`:
drift beyond the floor within the margin), or a metric's verdict moved since the last run.

"The last run" is the latest earlier run of the same profile that reached a verdict (passed
or failed); runs that errored or were cancelled have no verdicts to compare with.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Run, SuiteResult
from service.runs.state import Status

Kind = Literal["run_failed", "run_error", "run_warned", "verdict_changed"]
JUDGED = (Status.PASSED.value, Status.FAILED.value)
MAX_ERROR_CHARS = 600


class MetricVerdict(BaseModel):
    arm: str
    suite: str
    metric: str
    value: float
    verdict: str
    previous_verdict: str | None
    changed: bool
    explanation: str


class RunRef(BaseModel):
    id: int
    profile: str
    status: str
    verdict: str | None
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


def _line(m: MetricVerdict, previous_run_id: int | None) -> str:
    was = f" (was {m.previous_verdict} in run {previous_run_id})" if m.changed else ""
    return f"• {m.suite}.{m.metric} = {m.value:.4f}: {m.verdict}{was}. {m.explanation}".rstrip()


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
                verdict=row.verdict or "",
                previous_verdict=was,
                changed=was is not None and was != row.verdict,
                explanation=row.explanation,
            )
        )
    kind: Kind
    if run.status == Status.ERROR.value:
        kind, headline = "run_error", "ended in ERROR (harness or engine broke; not an accuracy verdict)"
    elif run.status == Status.FAILED.value:
        kind, headline = "run_failed", "FAILED its accuracy gate"
    elif run.status == Status.PASSED.value and any(m.verdict == "warn" for m in metrics):
        kind, headline = "run_warned", "passed with a warning: drift beyond the floor, within the margin"
    elif run.status == Status.PASSED.value and any(m.changed for m in metrics):
        kind, headline = "verdict_changed", "passed, but a metric's verdict changed since the previous run"
    else:
        return None
    labels = ", ".join(f"{k}={v}" for k, v in sorted((run.labels or {}).items()))
    lines = [f"kvcanary: run {run.id} of {run.profile} {headline} [{run.trigger}{'; ' + labels if labels else ''}]"]
    if run.error:
        lines.append(f"error: {run.error[:MAX_ERROR_CHARS]}")
    shown = [m for m in metrics if m.changed or m.verdict != "pass"] or metrics
    lines += [_line(m, previous.id if previous else None) for m in shown]
    lines.append(run_url)
    return AlertMessage(
        kind=kind,
        text="\n".join(lines),
        run=RunRef(
            id=run.id,
            profile=run.profile,
            status=run.status,
            verdict=run.verdict,
            trigger=run.trigger,
            labels=run.labels or {},
            finished_at=run.finished_at,
            url=run_url,
        ),
        summary=run.verdict_summary,
        error=run.error,
        previous_run_id=previous.id if previous else None,
        metrics=metrics,
    )
