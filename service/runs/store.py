"""Samples and suite results in and out of the database.

Samples are written the moment a suite emits them, each batch in its own transaction, so an
engine that dies or a service that is killed keeps every finished item for the next attempt.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from evals import suites as suite_registry
from evals.records import MetricValue
from evals.records import Sample as SuiteSample
from evals.verdict import MetricJudgement
from service.db.models import Run, SuiteResult
from service.db.models import Sample as SampleRow


def save_samples(
    session: Session, run_id: int, arm: str, suite: str, primary_metric: str, samples: Sequence[SuiteSample]
) -> None:
    """Insert or replace samples by (run, arm, suite, key); the primary metric's kind sets `is_correct`
    and `severity`."""
    kind = suite_registry.metric_kind(suite, primary_metric)
    keys = [s.key for s in samples]
    if not keys:
        return
    drop_samples(session, run_id, arm, suite, keys)
    session.add_all(
        SampleRow(
            run_id=run_id,
            arm=arm,
            suite=suite,
            key=s.key,
            prompt_hash=s.prompt_hash,
            prompt=s.prompt,
            target=s.target,
            response=s.response,
            extracted=dict(s.extracted),
            correct={k: bool(v) for k, v in s.correct.items()},
            is_correct=kind.passed(s, primary_metric),
            error=s.error,
            data=dict(s.data),
            severity=kind.severity(s, primary_metric),
        )
        for s in samples
    )


def to_suite_sample(row: SampleRow) -> SuiteSample:
    return SuiteSample(
        key=row.key,
        prompt_hash=row.prompt_hash,
        prompt=row.prompt,
        target=row.target,
        response=row.response,
        extracted=dict(row.extracted or {}),
        correct=dict(row.correct or {}),
        error=row.error,
        data=dict(row.data or {}),
    )


def drop_samples(session: Session, run_id: int, arm: str, suite: str, keys: Collection[str]) -> None:
    """Delete the named samples of one run's arm and suite."""
    if keys:
        where = SampleRow.run_id == run_id, SampleRow.arm == arm, SampleRow.suite == suite, SampleRow.key.in_(keys)
        session.execute(delete(SampleRow).where(*where))


def load_samples(session: Session, run_id: int, arm: str, suite: str) -> dict[str, SuiteSample]:
    rows = session.scalars(
        select(SampleRow).where(SampleRow.run_id == run_id, SampleRow.arm == arm, SampleRow.suite == suite)
    )
    return {row.key: to_suite_sample(row) for row in rows}


def _detail(judgement: MetricJudgement | None, name: str) -> float | None:
    """An interval bound the verdict computed (Wilson, bootstrap) when the suite gave none."""
    value = judgement.details.get(name) if judgement else None
    return float(value) if isinstance(value, int | float) else None


def save_result(
    session: Session,
    run: Run,
    arm: str,
    suite: str,
    metric: MetricValue,
    empty_response_rate: float,
    judgement: MetricJudgement | None,
) -> None:
    """Store one metric with its verdict; a re-scored metric replaces the earlier row."""
    session.execute(
        delete(SuiteResult).where(
            SuiteResult.run_id == run.id,
            SuiteResult.arm == arm,
            SuiteResult.suite == suite,
            SuiteResult.metric == metric.name,
        )
    )
    session.add(
        SuiteResult(
            run_id=run.id,
            arm=arm,
            suite=suite,
            metric=metric.name,
            value=metric.value,
            stderr=metric.stderr,
            ci_low=metric.ci_low if metric.ci_low is not None else _detail(judgement, "ci_low"),
            ci_high=metric.ci_high if metric.ci_high is not None else _detail(judgement, "ci_high"),
            n=metric.n,
            direction=metric.direction,
            empty_response_rate=empty_response_rate,
            baseline_value=judgement.baseline if judgement else None,
            threshold=judgement.threshold if judgement else None,
            verdict=judgement.verdict if judgement else None,
            explanation=judgement.explanation if judgement else "",
            details=dict(judgement.details) if judgement else {},
        )
    )
