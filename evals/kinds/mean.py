"""The mean kind: a per-item number that is not a right/wrong flag (F1, a per-item BLEU or ROUGE).

A sample keeps its scores in `data["mean"]` (metric -> number). The value is their mean over
items, with a bootstrap interval over items; against a reference, a paired bootstrap of the
per-item differences on the items both runs scored. The statistics are the corpus-WER ones
with one "word" per item: a ratio of sums over a count of items is a mean. Which way is
better comes from the baseline (higher where none is given), since lm-eval names it per metric.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from evals.kinds import Change, MetricKind, Samples
from evals.numbers import format_number
from evals.records import Sample
from evals.stats import bootstrap_wer_interval, paired_bootstrap_wer, wer_mde, wer_stderr
from evals.verdict import POWER, Baseline, Measured, MetricJudgement, Paired, check_inputs, decide

NAME = "mean"


def scores(samples: Samples, metric: str) -> dict[str, float]:
    """key -> the item's score under `metric`; samples without one are left out."""
    return {key: float(s.data[NAME][metric]) for key, s in samples.items() if metric in s.data.get(NAME, {})}


def judge_mean(
    suite: str,
    metric: str,
    candidate: Mapping[str, float],
    baseline: Baseline | None,
    reference: Mapping[str, float] | None = None,
    *,
    alpha: float = 0.05,
    reference_label: str = "the reference run",
) -> MetricJudgement:
    """Judge per-item scores (key -> number) by their mean against a baseline and/or a reference run."""
    direction: Literal["higher", "lower"] = baseline.direction if baseline is not None else "higher"
    check_inputs(suite, metric, candidate, baseline, direction)
    keys = sorted(candidate)  # a fixed order keeps the seeded bootstrap reproducible
    values = [candidate[key] for key in keys]
    ones = [1] * len(keys)
    value = sum(values) / len(values)
    low, high = bootstrap_wer_interval(values, ones, confidence=1 - alpha)
    measured = Measured(
        items="items",
        fmt=format_number,
        fmt_width=format_number,
        value=value,
        n=len(keys),
        summary=f"{value:.4f} (mean over {len(keys)} items, {1 - alpha:.0%} CI {low:.4f}-{high:.4f})",
        unpaired_mde=lambda _value: wer_mde(values, ones, alpha=alpha, power=POWER),
        details={"stderr": wer_stderr(values, ones) if len(keys) > 1 else None, "ci_low": low, "ci_high": high},
    )
    paired = None if reference is None else _pair(candidate, reference, direction, alpha)
    return decide(suite, metric, measured, baseline, paired, reference is not None, reference_label, alpha)


def _pair(
    candidate: Mapping[str, float], reference: Mapping[str, float], direction: str, alpha: float
) -> Paired | None:
    keys = sorted(candidate.keys() & reference.keys())
    if not keys:
        return None
    cand = [candidate[key] for key in keys]
    ref = [reference[key] for key in keys]
    ones = [1] * len(keys)
    test = paired_bootstrap_wer(cand, ref, ones, confidence=1 - alpha)
    sign = 1 if direction == "higher" else -1
    worse = sum(1 for c, r in zip(cand, ref, strict=True) if sign * (c - r) < 0)
    better = sum(1 for c, r in zip(cand, ref, strict=True) if sign * (c - r) > 0)
    return Paired(
        matched=len(keys),
        reference_value=sum(ref) / len(ref),
        regressed=sign * test.delta < 0,
        p_value=test.p_value,
        mde=wer_mde(cand, ones, reference_errors=ref, alpha=alpha, power=POWER),
        summary=(
            f"{worse} worse and {better} better items, mean change {test.delta:+.4f} "
            f"({1 - alpha:.0%} CI {test.ci_low:+.4f} to {test.ci_high:+.4f}), paired bootstrap p={test.p_value:.2g}"
        ),
        details={"items_worse": worse, "items_better": better, "change": test.delta,
                 "change_ci_low": test.ci_low, "change_ci_high": test.ci_high},
    )  # fmt: skip


class MeanChange(BaseModel):
    key: str
    target: str
    response_a: str
    response_b: str
    score_a: float
    score_b: float


class MeanDiff(BaseModel):
    metric: str
    matched: int = Field(description="Items scored under this metric in both runs")
    lower: int = Field(description="Items whose score fell in run b")
    higher: int
    changes: list[MeanChange] = Field(description="Largest change first, falls before rises")


def diff_mean(a: Samples, b: Samples, *, metric: str, top: int = 50) -> MeanDiff:
    """Items whose score changed most between the runs, both responses side by side."""
    scores_a, scores_b = scores(a, metric), scores(b, metric)
    keys = scores_a.keys() & scores_b.keys()
    changed = sorted(
        (k for k in keys if scores_a[k] != scores_b[k]),
        key=lambda k: (-abs(scores_b[k] - scores_a[k]), scores_b[k] - scores_a[k], k),
    )
    lower = sum(1 for k in changed if scores_b[k] < scores_a[k])
    changes = [
        MeanChange(key=k, target=b[k].target, response_a=a[k].response, response_b=b[k].response,
                   score_a=scores_a[k], score_b=scores_b[k])
        for k in changed[:top]
    ]  # fmt: skip
    return MeanDiff(metric=metric, matched=len(keys), lower=lower, higher=len(changed) - lower, changes=changes)


def _diff(a: Samples, b: Samples, metrics: Sequence[str], top: int) -> list[MeanDiff] | None:
    scored = sorted(m for m in metrics if scores(a, m) and scores(b, m))
    return [diff_mean(a, b, metric=m, top=top) for m in scored] or None


def _changes(section: list[MeanDiff]) -> list[Change]:
    return [
        Change(d.metric, d.matched, d.lower, d.higher, f"{d.lower} items lower, {d.higher} higher of {d.matched}")
        for d in section
    ]


def _metrics_in(samples: Samples) -> list[str]:
    return sorted({m for s in samples.values() for m in s.data.get(NAME, {})})


def _passed(sample: Sample, metric: str) -> bool | None:
    return None  # a number has no right or wrong; pages order by the score instead (severity)


def _severity(sample: Sample, metric: str) -> float | None:
    found: Any = sample.data.get(NAME, {}).get(metric)
    return -float(found) if found is not None else None  # the lowest score first


KIND = MetricKind(
    name=NAME,
    direction="higher",
    items="items",
    scores=scores,
    judge=judge_mean,
    diff=_diff,
    section=list[MeanDiff],
    changes=_changes,
    passed=_passed,
    severity=_severity,
    metrics_in=_metrics_in,
    empty=[],
)
