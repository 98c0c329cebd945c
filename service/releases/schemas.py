"""The release summary document: the API returns it, the CLI prints it, the page renders it.

Like `RunDetail` for a run, one document holds every number and sentence about a release, so
the page, `kvcanary release-report` and `GET /api/v1/releases/{key}={value}` never disagree.
It imports nothing of the server: the client parses it from the service's JSON.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, Field, field_validator

ReleaseState = Literal["ready", "blocked", "incomplete"]
# How a profile stands in a release: its latest decided run's status, or why there is none.
Outcome = Literal["passed", "failed", "error", "inconclusive", "running", "not_run"]
NOT_RUN: Literal["not_run"] = "not_run"


def release_path(key: str, value: str) -> str:
    """`key=value` quoted for a URL path: a value may hold `/`, `?`, `#`, `%` or anything printable."""
    return quote(f"{key}={value}", safe="=")


class ReleaseRun(BaseModel):
    """The run a profile's row is read from."""

    id: int
    status: str
    verdict: str | None
    verdict_summary: str
    error: str
    triggered_by: str = ""
    triggered_role: str = Field("", description="ci, admin, scheduler or host (the CLI on the service's host)")
    arms: list[str] = Field(description="The arms' names, control first; empty: one arm, the profile's variant")
    created_at: datetime
    finished_at: datetime | None

    @field_validator("arms", mode="before")
    @classmethod
    def _arm_names(cls, arms: list[Any]) -> list[str]:
        """A stored run keeps each arm as {name, variant, engine}; the summary names them."""
        return [arm["name"] if isinstance(arm, dict) else str(arm) for arm in arms]


class MetricOutcome(BaseModel):
    """One (arm, suite, metric) of a run; `verdict` "not_run" and no metric when the suite has no result."""

    arm: str = Field(description="The arm's name as the run stored it (opaque)")
    suite: str
    metric: str | None
    value: float | None
    n: int | None
    ci_low: float | None
    ci_high: float | None
    direction: str | None
    baseline: float | None
    threshold: float | None
    verdict: str
    explanation: str
    shown: str = Field("-", description="The value as the metric's kind writes it, e.g. `not finite`")
    baseline_shown: str = "-"
    threshold_shown: str = "-"


class MetricChange(BaseModel):
    """A metric in both runs: this release's value against the previous release's."""

    arm: str
    suite: str
    metric: str
    direction: str
    previous: float
    current: float
    delta: float = Field(description="current - previous")
    worse: bool = Field(description="The change goes against the metric's direction")
    previous_shown: str = Field("-", description="`previous` as the metric's kind writes it")
    current_shown: str = Field("-", description="`current` as the metric's kind writes it")
    delta_shown: str = Field("-", description="`delta` with its sign; `-` where either value is not a number")


class PairedChange(BaseModel):
    """From the paired run diff of one arm and suite: items that got worse and better on the same inputs."""

    arm: str
    suite: str
    kind: str = Field(description="accuracy: flips of `metric`; wer: utterances; drift: prompts")
    metric: str | None
    matched: int
    worse: int = Field(description="accuracy: right->wrong; wer: more word errors; drift: diverged")
    better: int = Field(description="accuracy: wrong->right; wer: fewer word errors; drift: 0")
    summary: str


class Comparison(BaseModel):
    """The profile's latest decided run of the previous release against this one's."""

    previous_run_id: int
    metrics: list[MetricChange]
    paired: list[PairedChange]
    diff_links: dict[str, str] = Field(description="arm -> the dashboard's paired diff of the two runs")
    problem: str = Field("", description="Why some of the two runs could not be paired, if anything")


class MutationScore(BaseModel):
    """The profile's latest mutation batch (`kvcanary mutants`): how many kernel mutants its suites saw."""

    batch: str
    started_by: str = Field(description="Who started the batch (`kvcanary mutants`)")
    started_role: str = Field(description="admin, host (the CLI on the service's host) or scheduler")
    started_at: datetime
    caught: int = Field(description="Mutants caught (or whose engine died) by at least one suite")
    judged: int = Field(description="Mutants whose run finished")
    mutants: int = Field(description="Mutants in the batch")
    link: str = Field(description="The profile page, where the whole matrix is")


class ExploratoryRun(BaseModel):
    """A run that carries the release's label but may not decide it: shown, never counted."""

    id: int
    status: str
    verdict: str | None
    why: str = Field(description="What it changed of the profile, or the role that may not gate")


class ProfileRelease(BaseModel):
    """One profile's row: its latest decided gate-grade run in the release, and the change since the previous one."""

    profile: str
    required: bool
    outcome: Outcome = Field(description="The deciding run's status; inconclusive: it passed without a verdict")
    runs: int = Field(description="Runs of this profile carrying the release's label")
    run: ReleaseRun | None = Field(description="The latest passed, failed or errored gate-grade run: it decides")
    pending_run_id: int | None = Field(description="A newer gate-grade run still queued or going")
    history: str = Field(
        "", description="A failure the deciding run passed after, e.g. `failed #12, passed on re-run #15`"
    )
    exploratory: list[ExploratoryRun] = Field(
        default_factory=list, description="Runs that did not run the profile as defined or may not gate, newest first"
    )
    metrics: list[MetricOutcome]
    reasons: list[str] = Field(description="What failed, when the outcome is failed or error")
    comparison: Comparison | None
    previous_note: str = Field("", description="Why there is no comparison")
    mutation: MutationScore | None = Field(None, description="None: the profile has no mutation batch")


class ReleaseSummary(BaseModel):
    key: str
    value: str
    state: ReleaseState
    line: str = Field(description="The one-line answer: ready, or what blocks, or what has not run")
    blocking: list[str] = Field(description="Required profiles that failed or errored, each with why")
    missing: list[str] = Field(description="Required profiles with no decided run yet")
    required: list[str]
    previous: str | None = Field(description="The release compared with (a value of the same key)")
    previous_note: str
    profiles: list[ProfileRelease]
    links: dict[str, str]


class ReleaseListing(BaseModel):
    """A release in the list: its state from the runs' statuses alone."""

    value: str
    state: ReleaseState
    line: str
    runs: int
    profiles: list[str]
    first_run_at: datetime
    last_run_at: datetime
    link: str


class ReleaseIndex(BaseModel):
    key: str
    required: list[str]
    releases: list[ReleaseListing] = Field(description="Newest first (by each release's first run)")
