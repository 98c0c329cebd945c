"""The corpus kind: an lm-eval metric computed over the whole corpus, not averaged over items.

Corpus BLEU, chrF and TER, and the perplexities, are aggregations of per-item records (a
reference and a prediction, a log-likelihood and a length): the value of a corpus is not the
mean of its items'. A sample keeps its record in `data["corpus"][metric]`; the value is lm-eval's
own aggregation for the metric over every item, its interval from resampling items (a bootstrap
of the aggregation), and against a reference the same resamples drawn on the items both runs
scored, for a two-sided p-value of the change. Which way is better comes from the baseline
(higher where none is given). The aggregation is lm-eval's, imported when a run is judged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from evals.kinds import Change, MetricKind, Samples
from evals.numbers import format_number
from evals.stats import _z_alpha_power
from evals.verdict import POWER, Baseline, Measured, MetricJudgement, Paired, check_inputs, decide

NAME = "corpus"
RESAMPLES = 200  # each resample re-runs the aggregation (corpus BLEU: sacrebleu over every item)
METRICS = frozenset({"bleu", "chrf", "ter", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte"})


def aggregation(metric: str) -> Callable[[list[Any]], float]:
    """lm-eval's aggregation of a `task:metric,filter` metric (its registry's, by the metric's name)."""
    from lm_eval.api.registry import get_metric_aggregation

    found = get_metric_aggregation(metric.partition(":")[2].partition(",")[0])
    if found is None:
        raise ValueError(f"{metric}: lm-eval names no aggregation for it, so it cannot be judged over the corpus")
    return found


def scores(samples: Samples, metric: str) -> dict[str, Any]:
    """key -> the item's record under `metric` (as lm-eval logged it); samples without one are left out."""
    return {key: s.data[NAME][metric] for key, s in samples.items() if metric in s.data.get(NAME, {})}


def _resampled(aggregate: Callable[[list[Any]], float], columns: Sequence[list[Any]]) -> np.ndarray:
    """Each column aggregated over the same items drawn with replacement, RESAMPLES times."""
    rng = np.random.default_rng(0)
    n = len(columns[0])
    draws = rng.integers(0, n, size=(RESAMPLES, n))
    return np.array([[aggregate([column[i] for i in idx]) for column in columns] for idx in draws])


def judge_corpus(
    suite: str,
    metric: str,
    candidate: Mapping[str, Any],
    baseline: Baseline | None,
    reference: Mapping[str, Any] | None = None,
    *,
    alpha: float = 0.05,
    reference_label: str = "the reference run",
) -> MetricJudgement:
    """Judge per-item records by lm-eval's corpus aggregation against a baseline and/or a reference run."""
    direction: Literal["higher", "lower"] = baseline.direction if baseline is not None else "higher"
    check_inputs(suite, metric, candidate, baseline, direction)
    aggregate = aggregation(metric)
    keys = sorted(candidate)
    items = [candidate[key] for key in keys]
    value = float(aggregate(items))
    values = _resampled(aggregate, [items])[:, 0]
    tail = alpha / 2 * 100
    low, high = (float(x) for x in np.percentile(values, [tail, 100 - tail]))
    k = sum(_z_alpha_power(alpha, POWER))
    measured = Measured(
        items="items",
        fmt=format_number,
        fmt_width=format_number,
        value=value,
        n=len(keys),
        summary=f"{value:.4f} (over {len(keys)} items, {1 - alpha:.0%} CI {low:.4f}-{high:.4f} from {RESAMPLES} "
        "resamples of items)",
        unpaired_mde=lambda _value: k * float(values.std(ddof=1)),
        details={"stderr": float(values.std(ddof=1)), "ci_low": low, "ci_high": high, "resamples": RESAMPLES},
    )
    paired = None if reference is None else _pair(aggregate, candidate, reference, direction, alpha)
    return decide(suite, metric, measured, baseline, paired, reference is not None, reference_label, alpha)


def _pair(
    aggregate: Callable[[list[Any]], float],
    candidate: Mapping[str, Any],
    reference: Mapping[str, Any],
    direction: str,
    alpha: float,
) -> Paired | None:
    keys = sorted(candidate.keys() & reference.keys())
    if not keys:
        return None
    cand, ref = [candidate[key] for key in keys], [reference[key] for key in keys]
    delta = float(aggregate(cand)) - float(aggregate(ref))
    pairs = _resampled(aggregate, [cand, ref])
    deltas = pairs[:, 0] - pairs[:, 1]
    smaller = min(int((deltas <= 0).sum()), int((deltas >= 0).sum()))
    p = min(1.0, (2 * smaller + 1) / (len(deltas) + 1))
    tail = alpha / 2 * 100
    low, high = (float(x) for x in np.percentile(deltas, [tail, 100 - tail]))
    sign = 1 if direction == "higher" else -1
    return Paired(
        matched=len(keys),
        reference_value=float(aggregate(ref)),
        regressed=sign * delta < 0,
        p_value=p,
        mde=sum(_z_alpha_power(alpha, POWER)) * float(deltas.std(ddof=1)),
        summary=(
            f"change {delta:+.4f} ({1 - alpha:.0%} CI {low:+.4f} to {high:+.4f}), paired bootstrap over items p={p:.2g}"
        ),
        details={"change": delta, "change_ci_low": low, "change_ci_high": high},
    )


class CorpusDiff(BaseModel):
    metric: str
    matched: int = Field(description="Items with a record under this metric in both runs")
    value_a: float = Field(description="The corpus value of run a on the matched items")
    value_b: float


def _diff(a: Samples, b: Samples, metrics: Sequence[str], top: int) -> list[CorpusDiff] | None:
    found = []
    for metric in sorted(metrics):
        records_a, records_b = scores(a, metric), scores(b, metric)
        keys = sorted(records_a.keys() & records_b.keys())
        if keys:
            aggregate = aggregation(metric)
            found.append(CorpusDiff(
                metric=metric, matched=len(keys), value_a=aggregate([records_a[k] for k in keys]),
                value_b=aggregate([records_b[k] for k in keys]),
            ))  # fmt: skip
    return found or None


def _changes(section: list[CorpusDiff]) -> list[Change]:
    return [
        Change(d.metric, d.matched, 0, 0, f"{d.value_a:.4f} → {d.value_b:.4f} over {d.matched} items") for d in section
    ]


def _metrics_in(samples: Samples) -> list[str]:
    return sorted({m for s in samples.values() for m in s.data.get(NAME, {})})


KIND = MetricKind(
    name=NAME,
    direction="higher",
    items="items",
    scores=scores,
    judge=judge_corpus,
    diff=_diff,
    section=list[CorpusDiff],
    changes=_changes,
    passed=lambda _sample, _metric: None,  # one item has no corpus value of its own
    metrics_in=_metrics_in,
    empty=[],
)
