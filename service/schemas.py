"""Request and response models: one schema per direction, never an ORM object on the wire.

`RunDetail` is the run's result document: the API returns it, the CLI prints it, the JUnit
writer and the dashboard render it, so all of them show the same numbers and words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    field_validator,
    model_validator,
)

from service.arms import describe_outcome
from service.profile_snapshot import digest, for_readers
from service.profiles import MAX_ARMS, NAME_PATTERN, ArmSpec, Expectation, Profile, RunOverrides
from service.text import INT64_MAX, label_value, nfc, storable

if TYPE_CHECKING:  # the client parses these documents without the server's database layer
    from service.db.models import Run, SuiteResult
    from service.db.models import Sample as SampleRow

LABEL_KEY = r"^[a-z][a-z0-9_.-]{0,63}$"
MAX_LABELS = 20
MAX_LABEL_VALUE = 512
MAX_LABEL_FILTERS = MAX_LABELS
# Labels only the service sets: a batch is a record `kvcanary mutants` makes, never a caller's label.
RESERVED_LABELS = {"mutation_batch": "mutation batches are started by `kvcanary mutants` (admin), not labelled"}

T = TypeVar("T")


def parse_label_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """`key=value` strings (CLI options, list filters) as labels, values in NFC; ValueError names the bad one."""
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"label {pair[:80]!r} must be key=value, e.g. git_sha=3f2a9c1")
        labels[key] = nfc(value.strip())
    return labels


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """Labels end up in filters, alerts, pages and release names: bounded, simple keys, values in NFC
    that read as they are stored (no control, format or bidi characters), no key the service reserves.
    Returns them normalised; ValueError names the label and the character."""
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels")
    checked = {}
    for key, raw in labels.items():
        if not re.match(LABEL_KEY, key):
            raise ValueError(f"label key {key!r} must match {LABEL_KEY}")
        if key in RESERVED_LABELS:
            raise ValueError(f"label {key!r} is reserved: {RESERVED_LABELS[key]}")
        try:
            value = label_value(raw)
        except ValueError as exc:
            raise ValueError(f"label {key!r}: {exc}") from exc
        if len(value) > MAX_LABEL_VALUE:
            raise ValueError(f"label {key!r}: at most {MAX_LABEL_VALUE} printable characters")
        checked[key] = value
    return checked


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
                {
                    "profile": "gsm8k-tiny-cpu",
                    "compare": [{"variant": "fixed"}, {"variant": "fixed", "engine": {"max_num_batched_tokens": 64}}],
                    "expect": {"fixed": "pass", "fixed,max_num_batched_tokens=64": "pass"},
                },
            ]
        },
    )

    profile: str = Field(pattern=NAME_PATTERN)
    labels: dict[str, str] = Field(default_factory=dict, description="e.g. git_sha, vllm_version, build_url")
    overrides: RunOverrides = Field(default_factory=RunOverrides)
    compare: list[ArmSpec] | None = Field(
        None,
        min_length=2,
        max_length=MAX_ARMS,
        description="Arms on the same prompts, control first: each a variant name, an arm name "
        "(`fixed,max_num_batched_tokens=64`) or {variant, engine}; replaces the profile's own arms",
    )
    expect: dict[str, Expectation] | None = Field(
        None, description="Arm name -> pass | fail; the run then ends as_expected or unexpected"
    )
    trigger: Literal["ci", "manual"] = "ci"

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return check_labels(labels)

    @field_validator("compare")
    @classmethod
    def _distinct(cls, compare: list[ArmSpec] | None) -> list[ArmSpec] | None:
        names = [arm.name for arm in compare or []]
        if len(set(names)) < len(names):
            raise ValueError(f"compare lists an arm twice ({', '.join(names)}); each arm must differ")
        return compare


class Progress(BaseModel):
    done: int
    total: int
    phase: str
    eta_s: float | None = Field(None, description="Seconds left in the current phase, from its rate so far")


class MetricOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

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
    baseline: float | None = Field(validation_alias=AliasChoices("baseline", "baseline_value"))
    threshold: float | None
    verdict: str | None
    explanation: str
    details: dict[str, Any]
    shown: str | None = Field(None, description="The value as its metric kind writes it, e.g. `not finite`")

    @classmethod
    def of(cls, row: SuiteResult) -> MetricOut:
        from evals.suites import shown  # the kinds compute with numpy, which the client has not

        out = cls.model_validate(row)
        return out.model_copy(update={"shown": shown(row.suite, row.metric, row.value, row.details)})


class ArmOut(BaseModel):
    name: str = Field(description="variant[,key=value...]: the key of the arm's samples and results")
    variant: str
    engine: dict[str, Any] = Field(description="Engine overrides of this arm over the profile's engine")


class RunSummary(BaseModel):
    id: int
    profile: str
    status: str
    verdict: str | None
    trigger: str
    triggered_by: str
    labels: dict[str, str]
    variants: list[str] = Field(description="The arms' names, control first; empty: one arm, the profile's variant")
    arms: list[ArmOut] = Field(default_factory=list, description="Each arm's name, variant and engine overrides")
    outcome: str | None = Field(None, description="With expectations: as_expected or unexpected, once judged")
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
    from service.db.models import utcnow

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
        "variants": [arm["name"] for arm in run.arms or []],
        "arms": run.arms or [],
        "outcome": run.outcome,
        "attempt": run.attempt,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "duration_s": duration,
        "progress": Progress(
            done=run.progress_done, total=run.progress_total, phase=run.progress_phase, eta_s=_eta(run)
        ),
    }


def engine_groups(engine: dict[str, Any], arms: list[str]) -> list[list[str]]:
    """The arms (in run order) of each numbered engine their facts name; arms without one left out."""
    numbered: dict[int, list[str]] = {}
    for arm in arms:
        use = (engine.get(arm) or {}).get("engine_use") or {}
        if isinstance(use.get("engine"), int):
            numbered.setdefault(use["engine"], []).append(arm)
    return [numbered[number] for number in sorted(numbered)]


class RunDetail(RunSummary):
    verdict_summary: str
    triggered_role: str = Field("", description="ci, admin, scheduler or host (the CLI on the service's host)")
    exploratory: str = Field(
        "",
        description="Why the run did not run its profile as defined (it then never decides a release); empty: it did",
    )
    expect: dict[str, str] | None = Field(None, description="Arm name -> what it must do (pass | fail)")
    arm_verdicts: dict[str, str] = Field(
        default_factory=dict, description="Arm name -> pass | fail (any metric failed) | error (its engine died)"
    )
    outcome_summary: str = Field("", description="Which arms did not do what was expected, or that all did")
    error: str
    max_attempts: int
    overrides: dict[str, Any]
    profile_digest: str | None = Field(
        None, description="Digest of the profile as resolved when the run was triggered; equal digests, equal profiles"
    )
    profile_snapshot: dict[str, Any] | None = Field(
        None,
        description="The profile as resolved when the run was triggered (overrides in place), which it executes, "
        "engine.env values hidden (names shown); null for runs queued before snapshots were stored, which "
        "executed the profile's file",
    )
    engine: dict[str, Any] = Field(
        description="Per arm: vLLM version, models, GPU, injection receipts, and `engine_use`: the engine it ran "
        "on (numbered in run order), the arm that started it, and either why it started fresh or its switch"
    )
    engine_groups: list[list[str]] = Field(
        default_factory=list, description="The arms of each engine the run started, in run order: arms that shared one"
    )
    timings: dict[str, Any]
    metrics: list[MetricOut]
    log_tail: str
    links: dict[str, str]

    @classmethod
    def of_run(cls, run: Run, results: list[SuiteResult], base_url: str = "") -> RunDetail:
        return cls(
            **_summary_fields(run),
            verdict_summary=run.verdict_summary,
            triggered_role=run.triggered_role,
            exploratory=run.exploratory,
            expect=run.expect,
            arm_verdicts=run.arm_verdicts or {},
            outcome_summary=describe_outcome(run.expect, run.arm_verdicts or {}) if run.outcome else "",
            error=run.error,
            max_attempts=run.max_attempts,
            overrides=run.overrides or {},
            profile_digest=digest(run.profile_snapshot) if run.profile_snapshot is not None else None,
            profile_snapshot=for_readers(run.profile_snapshot) if run.profile_snapshot is not None else None,
            engine=run.engine or {},
            engine_groups=engine_groups(
                run.engine or {}, [a["name"] for a in run.arms or []] or list(run.engine or {})
            ),
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
    model_config = ConfigDict(from_attributes=True)

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
    # The WER kind's counts, kept in `data["wer"]`, served also as the fields they were before;
    # `of` asks the kind for them (`evals.kinds.wer.api_fields`): the one declared conversion.
    substitutions: int | None = None
    deletions: int | None = None
    insertions: int | None = None
    ref_words: int | None = None
    word_errors: int | None = None
    error: str | None
    data: dict[str, Any] = Field(
        default_factory=dict, description="Kind-specific per-sample data, e.g. drift: both arms' tokens and logprobs"
    )
    severity: float | None = Field(None, description="How bad this sample is under its suite's kind; worst first")

    @classmethod
    def of(cls, row: SampleRow) -> SampleOut:
        from evals.kinds.wer import api_fields  # computes with numpy, which the client has not

        return cls.model_validate(row).model_copy(update=api_fields(row.data or {}))


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    offset: int
    limit: int


class BaselineOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

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

    profile: str = Field(pattern=NAME_PATTERN)
    suite: str = Field(pattern=NAME_PATTERN)
    metric: str = Field(pattern=NAME_PATTERN)
    value: float | None = Field(
        None, ge=0, le=1000, description="A rate (accuracy 0..1, WER from 0); null clears it, left out keeps it"
    )
    direction: Literal["higher", "lower"] | None = None
    tolerance_kind: Literal["absolute", "relative"] | None = None
    tolerance: float | None = Field(None, ge=0, le=10)
    source: Annotated[str, AfterValidator(storable)] | None = Field(None, max_length=1000)
    reference_run_id: StrictInt | None = Field(None, ge=1, le=INT64_MAX)

    @model_validator(mode="after")
    def _required_fields_not_null(self) -> BaselineUpdate:
        nulled = [
            name
            for name in ("direction", "tolerance_kind", "tolerance", "source")
            if name in self.model_fields_set and getattr(self, name) is None
        ]
        if nulled:
            raise ValueError(f"{', '.join(nulled)} cannot be null; leave a field out to keep its value")
        return self


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
    arms: list[str] = Field(default_factory=list, description="Names of the default arms of a run that names none")
    expect: dict[str, str] | None = None

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
            arms=[arm.name for arm in profile.compare or []],
            expect=profile.expect,
        )
