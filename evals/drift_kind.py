"""The drift metric kind: how scoring, the sample store, diffs and pages read drift samples.

A drift sample (`evals.suites.drift`) holds the prompt's floor row and, for a candidate, its
drift row (`evals.logprob_drift.PromptDrift`), with the margins its suite ran under; the kind
hands those to `evals.drift_verdict.judge_drift`, flags a prompt good when it is finite and its
greedy decode never diverged, and orders the worst (highest KL; non-finite first) first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evals.diff import SampleLike, diff_drift
from evals.drift_verdict import judge_drift
from evals.metric_kinds import MetricKind

NOT_FINITE = 1e30  # a non-finite KL where a number must be stored: above any KL, and still a JSON number
# (an infinity is not); the judgement's `kl_finite` flag says it is not a KL


def _scores(samples: Mapping[str, SampleLike], metric: str) -> dict[str, Any]:
    """key -> the prompt's floor and (for a candidate) drift rows, as `judge_drift` reads them."""
    fields = ("floor", "drift", "finite", "kl_tolerance", "dlogprob_tolerance")
    return {key: {k: s.data[k] for k in fields if k in s.data} for key, s in samples.items() if "floor" in s.data}


def _passed(sample: SampleLike, metric: str) -> bool | None:
    if "floor" not in sample.data:
        return None
    drift = sample.data.get("drift")
    return bool(sample.data["finite"]) and (drift is None or (drift["close"] and drift["first_divergence"] is None))


def _severity(sample: SampleLike, metric: str) -> float | None:
    row = sample.data.get("drift") or sample.data.get("floor")
    if row is None:
        return None
    return NOT_FINITE if not sample.data.get("finite", True) or row["mean_kl"] is None else float(row["mean_kl"])


DRIFT = MetricKind(
    name="drift",
    direction="lower",
    items="prompts",
    scores=_scores,
    judge=judge_drift,
    diff=lambda a, b, metrics, top: diff_drift(a, b, top=top),
    passed=_passed,
    severity=_severity,
)
