"""ORM models. The API never returns these: service/schemas.py renders them.

Portable across SQLite and PostgreSQL: JSON columns, timezone-aware timestamps stored as UTC,
and every uniqueness rule the queue relies on (idempotency key, one sample per item, one
fire per schedule and time) is a database constraint, not a Python check.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from service.profiles import ARM_NAME_MAX  # an arm's name, `fixed,max_num_batched_tokens=64`


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """SQLite drops time zones; this keeps every timestamp aware and in UTC on both engines."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime,
        dict[str, Any]: JSON,
        list[Any]: JSON,
    }


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        # Label containment filters use it; SQLite has no GIN (migration 0003 builds it on PostgreSQL only).
        Index("ix_runs_labels", "labels", postgresql_using="gin", postgresql_ops={"labels": "jsonb_path_ops"}).ddl_if(
            dialect="postgresql"
        ),
        # Covers /metrics' duration histogram: a scrape reads this narrow index, not the run rows.
        Index("ix_runs_durations", "profile", "duration_s"),
        Index("ix_runs_fair_order", "triggered_by", "started_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    profile: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(24), index=True)
    trigger: Mapped[str] = mapped_column(String(16), index=True)
    triggered_by: Mapped[str] = mapped_column(String(128), default="")
    # The API token that queued it (None: the CLI, the scheduler, or before tokens were recorded).
    triggered_by_token_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_tokens.id", ondelete="SET NULL", name="fk_runs_triggered_by_token_id")
    )
    # The role that triggered it: a token's role, `scheduler`, or `host` (the CLI on the service's host).
    triggered_role: Mapped[str] = mapped_column(String(16), default="", server_default="")
    # Why it did not run its profile as defined ("" when it did): such a run never decides a release.
    exploratory: Mapped[str] = mapped_column(Text, default="", server_default="")
    labels: Mapped[dict[str, Any]] = mapped_column(JSON().with_variant(JSONB(), "postgresql"), default=dict)
    overrides: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # The profile as resolved when the run was triggered (overrides in place), which it executes;
    # None for runs queued before it was stored, which execute their profile by name.
    profile_snapshot: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Each arm as {name, variant, engine overrides} (service.profiles.ArmSpec.stored); empty: one
    # arm, the profile's own variant. Samples and results are keyed by the arm's name.
    arms: Mapped[list[Any]] = mapped_column(default=list, server_default="[]")
    expect: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # arm name -> pass | fail
    arm_verdicts: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")  # arm -> pass|fail|error
    outcome: Mapped[str | None] = mapped_column(String(16))  # as_expected | unexpected, when expected
    # SHA-256 of the caller's token id and the key it sent: the same key from two callers is two runs.
    idempotency_key: Mapped[str | None] = mapped_column(String(128), unique=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker_id: Mapped[str | None] = mapped_column(String(128))
    engine_pid: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    duration_s: Mapped[float | None] = mapped_column(Float)  # finished_at - started_at, set as the run ends
    heartbeat_at: Mapped[datetime | None] = mapped_column()
    progress_done: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int] = mapped_column(Integer, default=0)
    progress_phase: Mapped[str] = mapped_column(String(255), default="")
    phase_started_at: Mapped[datetime | None] = mapped_column()
    verdict: Mapped[str | None] = mapped_column(String(16))
    verdict_summary: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str] = mapped_column(Text, default="")
    engine: Mapped[dict[str, Any]] = mapped_column(default=dict)
    timings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    log_tail: Mapped[str] = mapped_column(Text, default="")
    run_dir: Mapped[str] = mapped_column(String(512), default="")

    results: Mapped[list[SuiteResult]] = relationship(back_populates="run", cascade="all, delete-orphan")
    events: Mapped[list[RunEvent]] = relationship(back_populates="run", cascade="all, delete-orphan")


class SuiteResult(Base):
    __tablename__ = "suite_results"
    __table_args__ = (UniqueConstraint("run_id", "arm", "suite", "metric"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    arm: Mapped[str] = mapped_column(String(ARM_NAME_MAX))
    suite: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    stderr: Mapped[float | None] = mapped_column(Float)
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer)
    direction: Mapped[str] = mapped_column(String(8), default="higher")
    empty_response_rate: Mapped[float] = mapped_column(Float, default=0.0)
    baseline_value: Mapped[float | None] = mapped_column(Float)
    threshold: Mapped[float | None] = mapped_column(Float)
    verdict: Mapped[str | None] = mapped_column(String(16))
    explanation: Mapped[str] = mapped_column(Text, default="")
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)

    run: Mapped[Run] = relationship(back_populates="results")


class Sample(Base):
    __tablename__ = "samples"
    __table_args__ = (
        UniqueConstraint("run_id", "arm", "suite", "key"),
        Index("ix_samples_run_suite_correct", "run_id", "suite", "is_correct"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    arm: Mapped[str] = mapped_column(String(ARM_NAME_MAX))
    suite: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(256))
    prompt_hash: Mapped[str] = mapped_column(String(64))
    prompt: Mapped[str] = mapped_column(Text, default="")
    target: Mapped[str] = mapped_column(Text, default="")
    response: Mapped[str] = mapped_column(Text, default="")
    extracted: Mapped[dict[str, Any]] = mapped_column(default=dict)
    correct: Mapped[dict[str, Any]] = mapped_column(default=dict)
    is_correct: Mapped[bool | None] = mapped_column(Boolean)
    error: Mapped[str | None] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")  # each kind's, by its names
    severity: Mapped[float | None] = mapped_column(Float)  # the kind's "how bad", worst first on pages


class Baseline(Base):
    __tablename__ = "baselines"
    __table_args__ = (UniqueConstraint("profile", "suite", "metric"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    profile: Mapped[str] = mapped_column(String(64))
    suite: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(64))
    value: Mapped[float | None] = mapped_column(Float)
    direction: Mapped[str] = mapped_column(String(8), default="higher")
    tolerance_kind: Mapped[str] = mapped_column(String(16), default="absolute")
    tolerance: Mapped[float] = mapped_column(Float, default=0.08)
    source: Mapped[str] = mapped_column(Text, default="")
    reference_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_by: Mapped[str] = mapped_column(String(128), default="")


class BaselineChange(Base):
    __tablename__ = "baseline_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    profile: Mapped[str] = mapped_column(String(64), index=True)
    suite: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(64))
    changed_at: Mapped[datetime] = mapped_column(default=utcnow)
    changed_by: Mapped[str] = mapped_column(String(128))
    before: Mapped[dict[str, Any]] = mapped_column(default=dict)
    after: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Schedule(Base):
    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    profile: Mapped[str] = mapped_column(String(64))
    cron: Mapped[str] = mapped_column(String(128))
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    enabled: Mapped[bool] = mapped_column(Boolean, default=False)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    next_fire_at: Mapped[datetime | None] = mapped_column()
    last_fire_at: Mapped[datetime | None] = mapped_column()
    overridden: Mapped[bool] = mapped_column(Boolean, default=False)


class ScheduleFire(Base):
    __tablename__ = "schedule_fires"
    __table_args__ = (UniqueConstraint("schedule_id", "fire_time"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    fire_time: Mapped[datetime] = mapped_column()
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    skipped_reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # A run of fires skipped for one reason is one row: how many, and the first one's time.
    skipped_fires: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    first_fire_time: Mapped[datetime | None] = mapped_column()


class ApiToken(Base):
    __tablename__ = "api_tokens"
    __table_args__ = (UniqueConstraint("name", name="uq_api_tokens_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column()
    expires_at: Mapped[datetime | None] = mapped_column()
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class DashboardSession(Base):
    """A dashboard login: the cookie holds a random secret, this row only its hash.

    It ends at `expires_at`, when the reader logs out (the row is deleted), or when its
    token is revoked or expires (a lookup joins the token and checks both).
    """

    __tablename__ = "dashboard_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()


class RunEvent(Base):
    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")

    run: Mapped[Run] = relationship(back_populates="events")


class AlertCheck(Base):
    """One row per finished run the alert watcher judged; inserting it claims the run's alert."""

    __tablename__ = "alert_checks"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    checked_at: Mapped[datetime] = mapped_column(default=utcnow)
    checked_by: Mapped[str] = mapped_column(String(128), default="")
    outcome: Mapped[str] = mapped_column(Text, default="")


class AuditEvent(Base):
    """An admin action kept on its own: no foreign key, so the record of deleting a run outlives it."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(64))
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Quota(Base):
    """A queue limit an admin changed through the API; without a row, the setting's value holds."""

    __tablename__ = "quotas"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(Integer)
    changed_by: Mapped[str] = mapped_column(String(128))
    changed_at: Mapped[datetime] = mapped_column(default=utcnow)


class MutationBatch(Base):
    """A mutation batch `kvcanary mutants` started for one profile: who, when, which mutants, its
    run, and the matrix computed once when that run ended (None until then)."""

    __tablename__ = "mutation_batches"
    __table_args__ = (
        UniqueConstraint("batch", "profile", name="uq_mutation_batches_batch_profile"),
        Index("ix_mutation_batches_profile", "profile", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    batch: Mapped[str] = mapped_column(String(64))
    profile: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    started_by: Mapped[str] = mapped_column(String(128))
    started_role: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    mutants: Mapped[list[Any]] = mapped_column(default=list)
    settled_at: Mapped[datetime | None] = mapped_column()
    matrix: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))


class ReleaseComparison(Base):
    """A run that decides a release against the same profile's run in the previous release: the
    release page's comparison, computed when the later run ended (it reads every sample of both)."""

    __tablename__ = "release_comparisons"
    __table_args__ = (UniqueConstraint("previous_run_id", "run_id", name="uq_release_comparisons_pair"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    previous_run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    document: Mapped[dict[str, Any]] = mapped_column()
    computed_at: Mapped[datetime] = mapped_column(default=utcnow)
