"""Intervals, paired tests and detectable effects for accuracy and word error rate.

Accuracy is a mean of 0/1 items; WER is a ratio over the corpus (all word errors over all
reference words), not a mean of per-utterance rates, so its uncertainty comes from
resampling whole utterances. Paired tests compare two runs on the same items: exact
McNemar for accuracy (only the items that flipped carry information) and a paired
bootstrap over utterances for WER.

Every test here is two-sided at `alpha`; a caller that only cares about a regression
checks the direction of the change as well. The minimum detectable effects use the same
two-sided `alpha`, so "detectable" and "significant" mean the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

Counts = Sequence[float] | npt.NDArray[Any]  # one count per utterance, or any per-item number (a mean)
_BOOTSTRAP_CHUNK = 256  # resamples drawn at once: bounds memory at chunk x utterances indices


class PairedWer(NamedTuple):
    """Paired bootstrap result: `delta` = candidate WER - reference WER (positive is worse)."""

    delta: float
    p_value: float  # two-sided: twice the smaller bootstrap tail beyond zero
    ci_low: float
    ci_high: float


def _check_count(k: int, n: int) -> None:
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")


def _z(probability: float) -> float:
    return NormalDist().inv_cdf(probability)


def accuracy_stderr(k: int, n: int) -> float:
    """Standard error of a 0/1 mean with the n-1 sample variance, as lm-eval reports it."""
    _check_count(k, n)
    if n < 2:
        raise ValueError(f"a standard error needs at least 2 items, got n={n}")
    p = k / n
    return math.sqrt(p * (1 - p) / (n - 1))


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval: stays inside [0, 1] and keeps its coverage near 0 and 1."""
    _check_count(k, n)
    z = _z(0.5 + confidence / 2)
    p = k / n
    scale = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z / scale * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # The interval holds p; at k = 0 or n rounding can leave its bound a hair short of it.
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def _as_arrays(*columns: Counts) -> list[npt.NDArray[np.float64]]:
    lengths = {len(c) for c in columns}
    if len(lengths) != 1:
        raise ValueError(f"per-utterance columns differ in length: {sorted(lengths)}")
    arrays = [np.asarray(c, dtype=np.float64) for c in columns]
    if arrays[-1].sum() <= 0:
        raise ValueError("the reference transcripts hold no words: WER is undefined")
    return arrays


def corpus_wer(errors: Counts, words: Counts) -> float:
    """Word errors (S + D + I) summed over utterances, over reference words summed likewise."""
    e, w = _as_arrays(errors, words)
    return float(e.sum() / w.sum())


def wer_stderr(errors: Counts, words: Counts) -> float:
    """Standard error of the corpus WER by linearising the ratio over utterances."""
    e, w = _as_arrays(errors, words)
    return math.sqrt(_residual_square_sum(e, w)) / float(w.sum())


def _residual_square_sum(e: npt.NDArray[np.float64], w: npt.NDArray[np.float64]) -> float:
    """n/(n-1) * sum((e_i - WER * w_i)^2): the ratio's variance numerator, times W^2."""
    n = len(e)
    residuals = e - (e.sum() / w.sum()) * w
    return float((residuals**2).sum()) * n / max(n - 1, 1)


def _bootstrap_ratios(
    numerator: npt.NDArray[np.float64], words: npt.NDArray[np.float64], resamples: int, seed: int
) -> npt.NDArray[np.float64]:
    """sum(numerator) / sum(words) over utterances drawn with replacement, `resamples` times."""
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng(seed)
    n = len(words)
    out = []
    for start in range(0, resamples, _BOOTSTRAP_CHUNK):
        idx = rng.integers(0, n, size=(min(_BOOTSTRAP_CHUNK, resamples - start), n))
        totals = words[idx].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(numerator[idx].sum(axis=1) / totals)
    ratios = np.concatenate(out)
    return ratios[np.isfinite(ratios)]  # a resample of only empty references has no ratio


def bootstrap_wer_interval(
    errors: Counts,
    words: Counts,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of the corpus WER, resampling utterances (errors cluster in them)."""
    e, w = _as_arrays(errors, words)
    ratios = _bootstrap_ratios(e, w, resamples, seed)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: the discordant pairs as a Binomial(b + c, 1/2) test.

    Computed with integer binomial sums, so it is exact for any count.
    """
    if b < 0 or c < 0:
        raise ValueError(f"flip counts must be >= 0, got b={b}, c={c}")
    n = b + c
    tail, term = 0, 1  # term = C(n, i)
    for i in range(min(b, c) + 1):
        tail += term
        term = term * (n - i) // (i + 1)
    return min(1.0, 2 * tail / 2**n)


def paired_bootstrap_wer(
    cand_errors: Counts,
    ref_errors: Counts,
    words: Counts,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> PairedWer:
    """Change in corpus WER between two runs on the same utterances, resampled together.

    The p-value is two-sided, with the add-one correction so it is never 0:
    2 * min(#(delta* <= 0), #(delta* >= 0)) + 1 over resamples + 1, capped at 1.
    It is below 1 - confidence roughly when the percentile interval excludes 0.
    """
    c, r, w = _as_arrays(cand_errors, ref_errors, words)
    deltas = _bootstrap_ratios(c - r, w, resamples, seed)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(deltas, [tail, 100 - tail])
    smaller = min(int((deltas <= 0).sum()), int((deltas >= 0).sum()))
    p_value = min(1.0, (2 * smaller + 1) / (len(deltas) + 1))
    return PairedWer(float((c - r).sum() / w.sum()), p_value, float(low), float(high))


def _z_alpha_power(alpha: float, power: float) -> tuple[float, float]:
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must lie in (0, 1), got alpha={alpha}, power={power}")
    return _z(1 - alpha / 2), _z(power)


def _count_mde(square_sum: float, total: float, alpha: float, power: float) -> float:
    """Smallest change k * sqrt(S) / T a two-sided test at `alpha` finds with `power`.

    S is the spread of per-item changes or counts (a variance numerator), T the item or
    word total. A change of size D takes at least D * T whole flips or word errors, and a
    count of such events varies at least as much as its size, so S >= D * T under that
    change; hence the floor k^2 / T, which keeps a small or identical sample from
    claiming precision it does not have.
    """
    k = sum(_z_alpha_power(alpha, power))
    return max(k * math.sqrt(square_sum) / total, k * k / total)


NORMAL_ENOUGH = 10.0  # n p (1 - p) from which the binomial is treated as normal (the usual rule)


def accuracy_mde(
    n: int, p: float, *, alpha: float = 0.05, power: float = 0.8, discordant_rate: float | None = None
) -> float:
    """Minimum detectable accuracy drop at n items from accuracy p.

    Paired against a reference on the same n items, only discordant items vary: the
    spread is the discordant rate (McNemar's normal approximation, null variance,
    conservative). Unpaired (against a fixed value p), it is the one-sample binomial
    test's: where n p (1 - p) >= 10 its normal approximation, solving the power equation
    D = (z_a sqrt(p q) + z_b sqrt((p - D)(q + D))) / sqrt(n); elsewhere (near a perfect
    or a zero score, where the normal test has no variance to work with) the exact test's,
    `_exact_binomial_mde`. A drop of all of p is the most it reports.
    """
    if n < 1 or not 0 <= p <= 1:
        raise ValueError(f"need n >= 1 and 0 <= p <= 1, got n={n}, p={p}")
    if discordant_rate is not None:
        return _count_mde(discordant_rate * n, n, alpha, power)
    z_alpha, z_power = _z_alpha_power(alpha, power)
    if n * p * (1 - p) < NORMAL_ENOUGH:
        return _exact_binomial_mde(n, p, alpha, power)
    low, high = 0.0, p
    for _ in range(60):  # bisection for the D where the reach of the test meets D
        mid = (low + high) / 2
        reach = (z_alpha * math.sqrt(p * (1 - p)) + z_power * math.sqrt((p - mid) * (1 - p + mid))) / math.sqrt(n)
        low, high = (mid, high) if reach > mid else (low, mid)
    return high


def _binomial_log_pmf(i: int, n: int, p: float) -> float:
    if p <= 0 or p >= 1:
        return 0.0 if i == round(n * p) else -math.inf
    head = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
    return head + i * math.log(p) + (n - i) * math.log1p(-p)


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), from log-space terms so large n neither overflows nor underflows."""
    return min(1.0, math.fsum(math.exp(_binomial_log_pmf(i, n, p)) for i in range(max(k, -1) + 1)))


def _exact_binomial_mde(n: int, p: float, alpha: float, power: float) -> float:
    """The exact two-sided binomial test's MDE for a drop from p.

    The test rejects at c correct answers or fewer, c the largest count with
    P(X <= c | p) <= alpha/2; the MDE is the smallest drop D with P(X <= c | p - D) >=
    power. At p = 1 one wrong answer is significant, so the MDE is the drop that makes a
    wrong answer among n likely enough, 1 - (1 - power)^(1/n). At p = 0, or wherever no
    count is significant, no drop is detectable and the MDE is all of p.
    """
    critical, tail = -1, 0.0
    while critical + 1 < n:
        tail += math.exp(_binomial_log_pmf(critical + 1, n, p))
        if tail > alpha / 2:
            break
        critical += 1
    if critical < 0:
        return p
    low, high = 0.0, p
    for _ in range(60):  # bisection: the chance of rejecting rises as the true accuracy drops
        mid = (low + high) / 2
        low, high = (low, mid) if _binomial_cdf(critical, n, p - mid) >= power else (mid, high)
    return high


def wer_mde(
    errors: Counts,
    words: Counts,
    *,
    reference_errors: Counts | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
) -> float:
    """Minimum detectable WER rise for this corpus, paired when the reference's errors are given.

    Unpaired, the spread is the linearised variance of the ratio; paired, it is the sum of
    squared per-utterance error changes (zero-centred, as under no change).
    """
    e, w = _as_arrays(errors, words)
    if reference_errors is None:
        square_sum = _residual_square_sum(e, w)
    else:
        r, _ = _as_arrays(reference_errors, words)
        square_sum = float(((e - r) ** 2).sum())
    return _count_mde(square_sum, float(w.sum()), alpha, power)
