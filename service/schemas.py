"""Request and response models: one schema per direction, never an ORM object on the wire.

`RunDetail` is the run's result document: the API returns it, the CLI prints it, the JUnit
writer and the dashboard render it, so all of them show the same numbers and words.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.db.models import Run, SuiteResult, utcnow
from service.db.models import Sample as SampleRow
from service.profiles import Profile, RunOverrides, Variant

LABEL_KEY = r"^[a-z][a-z0-9_.-]{0,63}$"
MAX_LABELS = 20
MAX_LABEL_VALUE = 512

T = TypeVar("T")


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """Labels end up in filters, alerts and pages: bounded, simple keys, printable values."""
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels")
    for key, value in labels.items():
        if not re.match(LABEL_KEY, key):
            raise ValueError(f"label key {key!r} must match {LABEL_KEY}")
        if len(value) > MAX_LABEL_VALUE or any(ord(c) < 32 for c in value):
            raise ValueError(f"label {key!r}: at most {MAX_LABEL_VALUE} printable characters")
    return labels


class RunCreate(BaseModel):
    """What CI sends. Only `profile` is required."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "profile": "kimi-linear-48b-a3b",
                    "labels": {
                        "git_sha": "3f2a9c1",
                        "vllm_version": "0.24.0",
                        "build_url": "https://ci.example.com/build/1234",
                    },
                    "overrides": {"limit": 200},
                },
                {"profile": "whisper-large-v3", "compare": ["stock", "fixed"]},
            ]
        },
    )

    profile: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    labels: dict[str, str] = Field(default_factory=dict, description="e.g. git_sha, vllm_version, build_url")
    overrides: RunOverrides = Field(default_factory=RunOverrides)
    compare: list[Variant] | None = Field(
        None, min_length=2, max_length=2, description="A/B: two kernel variants on the same prompts, control first"
    )
    trigger: Literal["ci", "manual"] = "ci"

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return check_labels(labels)

    @field_validator("compare")
    @classmethod
    def _distinct(cls, compare: list[str] | None) -> list[str] | None:
        if compare is not None and compare[0] == compare[1]:
            raise ValueError("compare needs two different variants")
        return compare


class Progress(BaseModel):
    done: int
    total: int
    phase: str
    eta_s: float | None = Field(None, description="Seconds left in the current phase, from its rate so far")


class MetricOut(BaseModel):
    arm: str
    suite: str
    metric: str
    value: float
    n: int
    stderr: float | None
    ci_low: float | None
    ci_high: float | None
    direction: str
    empty_response_rate: float
    baseline: float | None
    threshold: float | None
    verdict: str | None
    explanation: str
    details: dict[str, Any]

    @classmethod
    def of(cls, row: SuiteResult) -> MetricOut:
        return cls(
            arm=row.arm,
            suite=row.suite,
            metric=row.metric,
            value=row.value,
            n=row.n,
            stderr=row.stderr,
            ci_low=row.ci_low,
            ci_high=row.ci_high,
            direction=row.direction,
            empty_response_rate=row.empty_response_rate,
            baseline=row.baseline_value,
            threshold=row.threshold,
            verdict=row.verdict,
            explanation=row.explanation,
            details=row.details or {},
        )


class RunSummary(BaseModel):
    id: int
    profile: str
    status: str
    verdict: str | None
    trigger: str
    triggered_by: str
    labels: dict[str, str]
    variants: list[str]
    attempt: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float | None
    progress: Progress

    @classmethod
    def of(cls, run: Run) -> RunSummary:
        return cls(**_summary_fields(run))


def _eta(run: Run) -> float | None:
    if not run.progress_done or not run.progress_total or not run.phase_started_at:
        return None
    elapsed = (utcnow() - run.phase_started_at).total_seconds()
    return round(elapsed / run.progress_done * (run.progress_total - run.progress_done), 1)


def _summary_fields(run: Run) -> dict[str, Any]:
    end = run.finished_at
    duration = (end - run.started_at).total_seconds() if end and run.started_at else None
    return {
        "id": run.id,
        "profile": run.profile,
        "status": run.status,
        "verdict": run.verdict,
        "trigger": run.trigger,
        "triggered_by": run.triggered_by,
        "labels": run.labels or {},
        "variants": run.variants or [],
        "attempt": run.attempt,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "duration_s": duration,
        "progress": Progress(
            done=run.progress_done, total=run.progress_total, phase=run.progress_phase, eta_s=_eta(run)
        ),
    }


class RunDetail(RunSummary):
    verdict_summary: str
    error: str
    max_attempts: int
    overrides: dict[str, Any]
    engine: dict[str, Any] = Field(description="Per arm: vLLM version, models, GPU, injection receipts")
    timings: dict[str, Any]
    metrics: list[MetricOut]
    log_tail: str
    links: dict[str, str]

    @classmethod
    def of_run(cls, run: Run, results: list[SuiteResult], base_url: str = "") -> RunDetail:
        return cls(
            **_summary_fields(run),
            verdict_summary=run.verdict_summary,
            error=run.error,
            max_attempts=run.max_attempts,
            overrides=run.overrides or {},
            engine=run.engine or {},
            timings=run.timings or {},
            metrics=[MetricOut.of(r) for r in results],
            log_tail=run.log_tail,
            links={
                "self": f"{base_url}/api/v1/runs/{run.id}",
                "samples": f"{base_url}/api/v1/runs/{run.id}/samples",
                "dashboard": f"{base_url}/runs/{run.id}",
            },
        )


class SampleOut(BaseModel):
    arm: str
    suite: str
    key: str
    prompt_hash: str
    prompt: str
    target: str
    response: str
    extracted: dict[str, Any]
    correct: dict[str, Any]
    is_correct: bool | None
    substitutions: int | None
    deletions: int | None
    insertions: int | None
    ref_words: int | None
    word_errors: int | None
    error: str | None
    data: dict[str, Any] = Field(
        default_factory=dict, description="Kind-specific per-sample data, e.g. drift: both arms' tokens and logprobs"
    )
    severity: float | None = Field(None, description="How bad this sample is under its suite's kind; worst first")

    @classmethod
    def of(cls, row: SampleRow) -> SampleOut:
        return cls.model_validate(row, from_attributes=True)


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    offset: int
    limit: int


class BaselineOut(BaseModel):
    profile: str
    suite: str
    metric: str
    value: float | None
    direction: str
    tolerance_kind: str
    tolerance: float
    source: str
    reference_run_id: int | None
    updated_at: datetime
    updated_by: str


class BaselineUpdate(BaseModel):
    """Fields to change on one baseline; the change is kept in its history."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "profile": "kimi-linear-48b-a3b",
                    "suite": "gsm8k",
                    "metric": "strict-match",
                    "value": 0.8711,
                    "source": "vLLM PR #47671, Kimi-Linear-48B-A3B, TRITON_MLA, GB200",
                }
            ]
        },
    )

    profile: str
    suite: str
    metric: str
    value: float | None = None
    direction: Literal["higher", "lower"] | None = None
    tolerance_kind: Literal["absolute", "relative"] | None = None
    tolerance: float | None = Field(None, ge=0)
    source: str | None = Field(None, max_length=1000)
    reference_run_id: int | None = None


class ProfileOut(BaseModel):
    name: str
    description: str
    model: str
    served_model_name: str
    suites: list[str]
    kernel_variant: str
    canaries: list[str]
    attention_backend: str | None
    tensor_parallel_size: int
    baselines: dict[str, dict[str, Any]]
    schedule: dict[str, Any] | None

    @classmethod
    def of(cls, profile: Profile) -> ProfileOut:
        return cls(
            name=profile.name,
            description=profile.description,
            model=profile.model,
            served_model_name=profile.served_model_name,
            suites=[entry.suite for entry in profile.suites],
            kernel_variant=profile.kernels.variant,
            canaries=list(profile.kernels.canaries),
            attention_backend=profile.engine.attention_backend,
            tensor_parallel_size=profile.engine.tensor_parallel_size,
            baselines={s: {m: b.model_dump() for m, b in ms.items()} for s, ms in profile.baselines.items()},
            schedule=profile.schedule.model_dump() if profile.schedule else None,
        )


class TokenCreated(BaseModel):
    name: str
    role: str
    token: str = Field(description="Shown once; only its hash is stored")
