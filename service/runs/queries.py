"""Read side of runs: filtered lists, the result document, samples. Routers and CLI call these."""

from __future__ import annotations

from sqlalchemy import ColumnElement, Select, func, select, type_coerce
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session, load_only

from service.db.models import Run, SuiteResult
from service.db.models import Sample as SampleRow
from service.schemas import Page, RunDetail, RunSummary, SampleOut

# What a list row shows; the wide columns (log tail, engine facts) stay in the database.
SUMMARY_COLUMNS = (
    Run.id, Run.profile, Run.status, Run.verdict, Run.trigger, Run.triggered_by, Run.labels, Run.arms,
    Run.outcome,
    Run.attempt, Run.created_at, Run.started_at, Run.finished_at, Run.progress_done, Run.progress_total,
    Run.progress_phase, Run.phase_started_at,
)  # fmt: skip


def label_is(dialect: str, key: str, value: str) -> ColumnElement[bool]:
    """On PostgreSQL a containment test, which the GIN index on labels answers."""
    if dialect == "postgresql":
        return type_coerce(Run.labels, JSONB).contains({key: value})
    return Run.labels[key].as_string() == value


def _runs_query(
    dialect: str, profile: str | None, status: str | None, trigger: str | None, label: dict[str, str] | None
) -> Select[Run]:
    query = select(Run)
    if profile:
        query = query.where(Run.profile == profile)
    if status:
        query = query.where(Run.status == status)
    if trigger:
        query = query.where(Run.trigger == trigger)
    for key, value in (label or {}).items():
        query = query.where(label_is(dialect, key, value))
    return query


def list_runs(
    session: Session,
    *,
    profile: str | None = None,
    status: str | None = None,
    trigger: str | None = None,
    label: dict[str, str] | None = None,
    offset: int = 0,
    limit: int = 50,
) -> Page[RunSummary]:
    query = _runs_query(session.get_bind().dialect.name, profile, status, trigger, label)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    page = query.options(load_only(*SUMMARY_COLUMNS, raiseload=True)).order_by(Run.id.desc())
    rows = session.scalars(page.offset(offset).limit(limit)).all()
    return Page[RunSummary](items=[RunSummary.of(r) for r in rows], total=total, offset=offset, limit=limit)


def run_detail(session: Session, run: Run, base_url: str = "") -> RunDetail:
    results = session.scalars(
        select(SuiteResult)
        .where(SuiteResult.run_id == run.id)
        .order_by(SuiteResult.arm, SuiteResult.suite, SuiteResult.id)
    ).all()
    return RunDetail.of_run(run, list(results), base_url)


def list_samples(
    session: Session,
    run_id: int,
    *,
    suite: str | None = None,
    arm: str | None = None,
    wrong_only: bool = False,
    search: str | None = None,
    offset: int = 0,
    limit: int = 50,
) -> Page[SampleOut]:
    """Wrong answers first, then the highest severity under the suite's kind: what a reviewer reads first."""
    query = select(SampleRow).where(SampleRow.run_id == run_id)
    if suite:
        query = query.where(SampleRow.suite == suite)
    if arm:
        query = query.where(SampleRow.arm == arm)
    if wrong_only:
        query = query.where(SampleRow.is_correct.is_(False))
    if search:
        pattern = f"%{search}%"
        query = query.where(
            SampleRow.prompt.ilike(pattern) | SampleRow.response.ilike(pattern) | SampleRow.target.ilike(pattern)
        )
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    ordered = query.order_by(
        SampleRow.is_correct.is_(True),
        SampleRow.severity.desc().nulls_last(),
        SampleRow.id,
    )
    rows = session.scalars(ordered.offset(offset).limit(limit)).all()
    return Page[SampleOut](items=[SampleOut.of(r) for r in rows], total=total, offset=offset, limit=limit)
