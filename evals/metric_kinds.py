"""Metric kinds: how one kind of metric reads per-sample rows, is judged, and is diffed.

A suite declares each metric it reports with a kind (`evals.suites.base.MetricSpec`);
scoring, run diffs, the sample store and the dashboard ask the kind instead of guessing
from which sample fields are set. A new kind of metric is one `MetricKind` here (or in
its suite's module) and one dashboard partial per view, with no branch added elsewhere.

- `accuracy`: per-item correct flags (`Sample.correct[metric]`), higher is better, judged
  with a Wilson interval and exact McNemar when paired; any suite that scores items right
  or wrong reuses it.
- `wer`: per-utterance word error counts, lower is better, corpus WER with a bootstrap
  interval and a paired bootstrap when paired.

The drift suite declares its own kind (`drift`, in `evals/drift_kind.py`); the generic
lm-eval suite reports every metric its profile names as `accuracy` (its open kind).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from evals.diff import SampleLike, correct_flags, diff_accuracy, diff_wer, word_errors
from evals.verdict import Judge, judge_accuracy, judge_wer

Scores = Mapping[str, Any]  # sample key -> the per-item score a judge reads


@dataclass(frozen=True)
class MetricKind:
    """One kind of metric, declared once and used by every reader of per-sample rows.

    `scores(samples, metric)`: key -> per-item score; samples not scored for `metric` are
    left out, and no scores at all means nothing supports the metric's value.
    `judge`: the verdict from those scores against a baseline and, when given, a reference
    or control arm's scores (paired by key; see `evals.verdict.Judge`).
    `diff(a, b, metrics, top)`: the run diff's section for this kind (a mapping of the
    `SuiteDiff` field named `name` to its content), or None when nothing is comparable.
    `passed(sample, metric)`: the per-sample good/bad flag the store indexes (None: unscored).
    `severity(sample, metric)`: how bad a sample is, for pages that list the worst first (None: the
    fixed columns order them already).
    """

    name: str
    direction: Literal["higher", "lower"]
    items: str  # what one sample is, in explanations and pages: items, utterances, prompts
    scores: Callable[[Mapping[str, SampleLike], str], dict[str, Any]]
    judge: Judge
    diff: Callable[[Mapping[str, Any], Mapping[str, Any], Sequence[str], int], Any | None]
    passed: Callable[[SampleLike, str], bool | None]
    severity: Callable[[SampleLike, str], float | None] = lambda _sample, _metric: None


def _accuracy_diff(a: Mapping[str, Any], b: Mapping[str, Any], metrics: Sequence[str], top: int) -> Any | None:
    """Flips each way per metric that run `a` scored; metrics `b` did not score are left out."""
    scored = sorted(m for m in metrics if correct_flags(a, m))
    if not scored:
        return None
    return [diff_accuracy(a, b, metric=m) for m in scored if correct_flags(b, m)]


def _wer_diff(a: Mapping[str, Any], b: Mapping[str, Any], metrics: Sequence[str], top: int) -> Any | None:
    if not (word_errors(a) and word_errors(b)):
        return None
    return diff_wer(a, b, top=top)


def _accuracy_passed(sample: SampleLike, metric: str) -> bool | None:
    return bool(sample.correct[metric]) if metric in sample.correct else None


def _wer_passed(sample: SampleLike, metric: str) -> bool | None:
    counts = word_errors({"": sample})
    return counts[""][0] == 0 if counts else None


ACCURACY = MetricKind(
    name="accuracy",
    direction="higher",
    items="items",
    scores=correct_flags,
    judge=judge_accuracy,
    diff=_accuracy_diff,
    passed=_accuracy_passed,
)

WER = MetricKind(
    name="wer",
    direction="lower",
    items="utterances",
    scores=lambda samples, _metric: word_errors(samples),
    judge=judge_wer,
    diff=_wer_diff,
    passed=_wer_passed,
)
