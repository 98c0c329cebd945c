"""Metric kinds: each kind of metric is one module that owns everything about it.

A suite declares each metric it reports with a kind (`evals.suites.base.MetricSpec`). The
kind's module owns its per-sample data (kept in `Sample.data` under the kind's name where it
is not the generic `correct` flag), how samples are scored and judged, each sample's
good/bad flag and severity, the run diff's section (a pydantic model the API serves as it
is) and how its value reads. Scoring, the sample store, run diffs, release summaries and the
dashboard ask the kind; a new kind is one module listed in `_MODULES` plus one dashboard
partial per view (`samples/<kind>.html`, `diff/<kind>.html`), with no branch added elsewhere.

- `accuracy`: per-item correct flags, Wilson interval, exact McNemar when paired;
- `wer`: per-utterance word error counts, corpus WER, (paired) bootstrap over utterances;
- `mean`: any other per-item number (F1 per item), mean with a (paired) bootstrap;
- `corpus`: an lm-eval metric aggregated over the corpus (BLEU, perplexity), resampling items;
- `drift`: greedy decode and logprobs against an A/A floor (`evals.drift_verdict`);
- `invariance`: the same tokens under serving conditions (`evals.invariance`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from evals.numbers import format_number
from evals.records import Sample
from evals.registry import Registry

if TYPE_CHECKING:
    from evals.verdict import Judge

Samples = Mapping[str, Sample]

_MODULES = (
    "evals.kinds.accuracy",
    "evals.kinds.wer",
    "evals.kinds.drift",
    "evals.kinds.invariance",
    "evals.kinds.mean",
    "evals.kinds.corpus",
)


@dataclass(frozen=True)
class Change:
    """One line of a release summary: what a diff section counts, one metric (or the suite) at a time."""

    metric: str | None
    matched: int
    worse: int
    better: int
    summary: str


@dataclass(frozen=True, eq=False)  # one instance per kind: compared and hashed by identity
class MetricKind:
    """One kind of metric, declared once and used by every reader of per-sample rows.

    `scores(samples, metric)`: key -> per-item score; samples not scored for `metric` are
    left out, and no scores at all means nothing supports the metric's value.
    `judge`: the verdict from those scores against a baseline and, when given, a reference
    or control arm's scores (paired by key; see `evals.verdict.Judge`).
    `diff(a, b, metrics, top)`: the run diff's section for this kind, of type `section`
    (`empty` where there is none), or None when nothing is comparable.
    `changes(section)`: the section's counts as release-summary lines (none: not summarised).
    `metrics_in(samples)`: the metrics the rows hold, for suites whose profile names them.
    `passed(sample, metric)`: the per-sample good/bad flag the store indexes (None: unscored).
    `severity(sample, metric)`: how bad a sample is; pages list the worst first (None: unscored).
    `totals`: per-suite sums pages show, each the sum of `data[a][b]` over the paths named.
    `marks(target, response)`: what the samples page marks inside a sample's texts (None: nothing).
    `display(value, details, missing)`: the value as every report writes it (CLI, JUnit, pages,
    summaries), in `evals.numbers`' format; `missing` where there is no value.
    `plotted(value, details)`: the value a chart draws (None: no point, e.g. a non-finite KL).
    `filters`: template filters the kind's dashboard partials use, by name.
    """

    name: str
    direction: Literal["higher", "lower"]
    items: str  # what one sample is, in explanations and pages: items, utterances, prompts
    scores: Callable[[Samples, str], dict[str, Any]]
    judge: Judge
    diff: Callable[[Samples, Samples, Sequence[str], int], Any | None]
    section: Any  # the diff section's type, as the run diff's field of this kind's name declares it
    passed: Callable[[Sample, str], bool | None]
    changes: Callable[[Any], list[Change]] = lambda _section: []
    severity: Callable[[Sample, str], float | None] = lambda _sample, _metric: None
    metrics_in: Callable[[Samples], list[str]] = lambda _samples: []
    empty: Any = None  # the section where the suite has none (accuracy: no metric, an empty list)
    totals: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    marks: Callable[[str, str], Any] | None = None
    display: Callable[[float | None, Mapping[str, Any] | None, str], str] = lambda value, _details, missing: (
        format_number(value, missing=missing)
    )
    plotted: Callable[[float, Mapping[str, Any] | None], float | None] = lambda value, _details: value
    filters: Mapping[str, Callable[..., Any]] = field(default_factory=dict)


REGISTRY: Registry[MetricKind] = Registry("metric kind", _MODULES, "KIND", lambda kind: kind.name)
registry = REGISTRY.all  # every kind by name, in the order run diffs list their sections
get = REGISTRY.get
