"""The accuracy kind: per-item right/wrong flags (`Sample.correct[metric]`), higher is better.

Judged with a Wilson interval and, against a reference, exact McNemar on the items both runs
answered; diffed as the items that flipped each way. Any suite that scores items right or
wrong reuses it (GSM8k, lm-eval's 0/1 metrics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, Field

from evals.kinds import Change, MetricKind, Samples
from evals.numbers import format_number
from evals.records import Sample
from evals.stats import accuracy_mde, accuracy_stderr, mcnemar_exact, wilson_interval
from evals.verdict import POWER, Baseline, Measured, MetricJudgement, Paired, check_inputs, decide


def correct_flags(samples: Samples, metric: str) -> dict[str, bool]:
    """key -> correct under `metric`; samples without a flag for it are left out."""
    return {key: s.correct[metric] for key, s in samples.items() if metric in s.correct}


def judge_accuracy(
    suite: str,
    metric: str,
    candidate: Mapping[str, bool],
    baseline: Baseline | None,
    reference: Mapping[str, bool] | None = None,
    *,
    alpha: float = 0.05,
    reference_label: str = "the reference run",
) -> MetricJudgement:
    """Judge per-item correctness (key -> correct) against a baseline and/or a reference run."""
    check_inputs(suite, metric, candidate, baseline, "higher")
    n, k = len(candidate), sum(candidate.values())
    value = k / n
    low, high = wilson_interval(k, n, 1 - alpha)
    measured = Measured(
        items="items",
        fmt=format_number,
        fmt_width=format_number,
        value=value,
        n=n,
        summary=f"{value:.4f} ({k}/{n} correct, {1 - alpha:.0%} CI {low:.4f}-{high:.4f})",
        unpaired_mde=lambda p: accuracy_mde(n, p, alpha=alpha, power=POWER),
        details={"correct": k, "stderr": accuracy_stderr(k, n) if n > 1 else None, "ci_low": low, "ci_high": high},
    )
    paired = None if reference is None else _pair(candidate, reference, alpha)
    return decide(suite, metric, measured, baseline, paired, reference is not None, reference_label, alpha)


def _pair(candidate: Mapping[str, bool], reference: Mapping[str, bool], alpha: float) -> Paired | None:
    keys = candidate.keys() & reference.keys()
    if not keys:
        return None
    down = sum(1 for key in keys if reference[key] and not candidate[key])
    up = sum(1 for key in keys if candidate[key] and not reference[key])
    m = len(keys)
    ref_value = sum(reference[key] for key in keys) / m
    p = mcnemar_exact(down, up)
    return Paired(
        matched=m,
        reference_value=ref_value,
        regressed=down > up,
        p_value=p,
        mde=accuracy_mde(m, ref_value, alpha=alpha, power=POWER, discordant_rate=(down + up) / m),
        summary=f"{down} right->wrong, {up} wrong->right, exact McNemar p={p:.2g}",
        details={"flips_down": down, "flips_up": up, "change": (up - down) / m},
    )


class Flip(BaseModel):
    key: str
    target: str
    response_a: str
    response_b: str
    extracted_a: str | None
    extracted_b: str | None


class AccuracyDiff(BaseModel):
    metric: str
    matched: int = Field(description="Items scored under this metric in both runs")
    right_to_wrong: list[Flip]
    wrong_to_right: list[Flip]


def diff_accuracy(a: Samples, b: Samples, *, metric: str) -> AccuracyDiff:
    """Items whose `metric` flag differs between the runs, both responses side by side, by key."""
    flags_a, flags_b = correct_flags(a, metric), correct_flags(b, metric)
    keys = sorted(flags_a.keys() & flags_b.keys())
    down: list[Flip] = []
    up: list[Flip] = []
    for key in keys:
        if flags_a[key] == flags_b[key]:
            continue
        sa, sb = a[key], b[key]
        flip = Flip(
            key=key, target=sb.target, response_a=sa.response, response_b=sb.response,
            extracted_a=sa.extracted.get(metric), extracted_b=sb.extracted.get(metric),
        )  # fmt: skip
        (down if flags_a[key] else up).append(flip)
    return AccuracyDiff(metric=metric, matched=len(keys), right_to_wrong=down, wrong_to_right=up)


def _diff(a: Samples, b: Samples, metrics: Sequence[str], top: int) -> list[AccuracyDiff] | None:
    """Flips each way per metric that run `a` scored; metrics `b` did not score are left out."""
    scored = sorted(m for m in metrics if correct_flags(a, m))
    if not scored:
        return None
    return [diff_accuracy(a, b, metric=m) for m in scored if correct_flags(b, m)]


def _changes(section: list[AccuracyDiff]) -> list[Change]:
    return [
        Change(
            d.metric,
            d.matched,
            len(d.right_to_wrong),
            len(d.wrong_to_right),
            f"{len(d.right_to_wrong)} right→wrong, {len(d.wrong_to_right)} wrong→right of {d.matched} items",
        )
        for d in section
    ]


def _passed(sample: Sample, metric: str) -> bool | None:
    return bool(sample.correct[metric]) if metric in sample.correct else None


def _metrics_in(samples: Samples) -> list[str]:
    return sorted({m for s in samples.values() for m in s.correct})


KIND = MetricKind(
    name="accuracy",
    direction="higher",
    items="items",
    scores=correct_flags,
    judge=judge_accuracy,
    diff=_diff,
    section=list[AccuracyDiff],
    changes=_changes,
    passed=_passed,
    metrics_in=_metrics_in,
    empty=[],
)
