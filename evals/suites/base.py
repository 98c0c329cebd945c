"""The contract between the run machinery and an evaluation suite.

A suite gets a live OpenAI-compatible server URL and a `SuiteContext`, and returns a
`SuiteOutcome`. It knows no HTTP layer of ours and no database: samples leave through
`context.emit_samples` as they are finished, so a run that dies mid-suite keeps them.
It declares every metric it reports with its kind (`evals.kinds`): scoring, run
diffs, the sample store and the dashboard read, judge and show a metric through its kind.
What it produces, `Sample` and `MetricValue`, lives below the kinds in `evals.records`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from evals.records import MetricValue, Sample

if TYPE_CHECKING:  # the kinds compute with numpy; the bare client install has none
    from evals.kinds import MetricKind


class SuiteAborted(RuntimeError):
    """Raised by a suite when the run was cancelled or the engine died under it."""


@dataclass(frozen=True)
class SuiteOutcome:
    metrics: Sequence[MetricValue]
    samples: Sequence[Sample]
    empty_response_rate: float
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class SuiteContext:
    """What a suite may use besides the server: its config, a folder, and callbacks.

    `progress(done, total)` reports progress; `emit_samples` hands finished samples to the
    run store at once; `done_samples` holds samples stored by an earlier, interrupted
    attempt of the same run, keyed by `Sample.key`, which a suite may reuse instead of
    asking the server again; `should_stop()` is true once the run was cancelled or the
    engine died, and a suite checks it between requests. `reference_samples` are the same
    suite's samples from what this arm is compared with (the first arm of an A/B run, else the
    promoted reference run), for suites that compare outputs rather than scores (drift);
    `engine_change` the engine arguments in which this arm's engine differs from that arm's
    (`{key: [theirs, mine]}`; empty: the kernels alone differ; None: not known, as against a
    reference run), which a comparing suite stores with its samples for the verdict's rules.
    """

    server_url: str
    served_model_name: str
    model_path: str
    config: Any
    work_dir: Path
    progress: Callable[[int, int], None] = lambda done, total: None
    emit_samples: Callable[[Sequence[Sample]], None] = lambda samples: None
    done_samples: Mapping[str, Sample] = field(default_factory=dict)
    reference_samples: Mapping[str, Sample] = field(default_factory=dict)
    engine_change: Mapping[str, list[Any]] | None = None
    stop_event: threading.Event = field(default_factory=threading.Event)

    def should_stop(self) -> bool:
        return self.stop_event.is_set()


class SuiteConfig(BaseModel):
    """Base of every suite's profile block; `limit` caps the items (None = all)."""

    model_config = {"extra": "forbid"}

    limit: int | None = Field(None, ge=1)
    concurrency: int = Field(64, ge=1)
    max_retries: int = Field(3, ge=0)
    request_timeout_s: float = Field(600.0, gt=0)
    max_empty_response_rate: float = Field(0.2, ge=0, le=1)

    def metric_names(self) -> tuple[str, ...]:
        """Metrics this config reports, for suites whose metrics depend on it (see SuiteDefinition)."""
        return ()


@dataclass(frozen=True)
class MetricSpec:
    """One metric a suite reports, by name, and the kind that reads, judges and diffs it."""

    name: str
    kind: MetricKind


@dataclass(frozen=True)
class SuiteDefinition:
    """A registered evaluation: profiles name it; `metrics` declare what it reports, primary first.

    A suite whose metrics the profile's config names (the generic lm-eval suite, for whatever
    tasks it is given) declares none and gives `open_kind`, which names the kind of each metric it reports.
    """

    name: str
    config_model: type[SuiteConfig]
    metrics: tuple[MetricSpec, ...]
    run: Callable[[SuiteContext], SuiteOutcome]
    compares_outputs: bool = False  # the suite reads `SuiteContext.reference_samples` (drift)
    judges_control_arm: bool = False  # a comparing suite whose control arm has findings of its own (invariance)
    open_kind: Callable[[str], MetricKind] | None = None  # metric name -> its kind

    def metric_names(self, config: SuiteConfig | None = None) -> tuple[str, ...]:
        declared = tuple(spec.name for spec in self.metrics)
        return declared or (config.metric_names() if config is not None else ())

    def kind_of(self, metric: str) -> MetricKind:
        for spec in self.metrics:
            if spec.name == metric:
                return spec.kind
        if self.open_kind is not None:
            return self.open_kind(metric)
        raise KeyError(
            f"suite {self.name!r} declares no metric {metric!r}; it reports {', '.join(self.metric_names())}"
        )

    def kinds(self) -> dict[MetricKind, list[str]]:
        """Each kind the suite declares, in declaration order, with its metric names."""
        found: dict[MetricKind, list[str]] = {}
        for spec in self.metrics:
            found.setdefault(spec.kind, []).append(spec.name)
        return found
