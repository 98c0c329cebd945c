"""Statistics against textbook values, independent implementations and simulated data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from lm_eval.api.metrics import mean_stderr
from scipy.stats import binomtest, norm

from evals.stats import (
    accuracy_mde,
    accuracy_stderr,
    bootstrap_wer_interval,
    corpus_wer,
    mcnemar_exact,
    paired_bootstrap_wer,
    wer_mde,
    wer_stderr,
    wilson_interval,
)


# Newcombe (1998), Stat Med 17:857-872, Table I, method 3 (Wilson score, no continuity correction).
@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_matches_newcombe(k: int, n: int, low: float, high: float) -> None:
    got = wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=5e-5)


def test_wilson_holds_the_estimate_at_every_count_including_all_and_none() -> None:
    """At k = n the upper bound is 1 exactly; computed naively it came out 0.9999999999999998 for
    n = 60 (a gate run's interval that missed its own score)."""
    for n in range(1, 401):
        for k in range(n + 1):
            low, high = wilson_interval(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0, (k, n, low, high)
        assert wilson_interval(n, n)[1] == 1.0 and wilson_interval(0, n)[0] == 0.0


def test_wilson_is_narrower_at_lower_confidence_and_stays_in_unit_interval() -> None:
    assert wilson_interval(20, 20)[1] == 1.0
    wide, narrow = wilson_interval(10, 40, 0.99), wilson_interval(10, 40, 0.90)
    assert wide[0] < narrow[0] < 0.25 < narrow[1] < wide[1]
    with pytest.raises(ValueError, match="k=5, n=4"):
        wilson_interval(5, 4)


def test_accuracy_stderr_is_lm_eval_convention() -> None:
    items = [1] * 1148 + [0] * 171
    assert accuracy_stderr(1148, 1319) == pytest.approx(mean_stderr(items), rel=1e-12)
    assert accuracy_stderr(1148, 1319) == pytest.approx(np.std(items, ddof=1) / math.sqrt(1319), rel=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        accuracy_stderr(1, 1)


@pytest.mark.parametrize(
    ("b", "c", "expected"),
    [
        (1, 7, 0.0703125),  # Fagerland et al. (2013) BMC Med Res Methodol 13:91: exact conditional p = 0.070
        (0, 5, 2 / 2**5),  # all five discordant pairs one way
        (0, 6, 2 / 2**6),
        (2, 10, 2 * (1 + 12 + 66) / 2**12),  # 2 * P(X <= 2), X ~ Binomial(12, 1/2)
        (4, 4, 1.0),
        (0, 0, 1.0),
    ],
)
def test_mcnemar_exact_textbook_values(b: int, c: int, expected: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)
    assert mcnemar_exact(c, b) == mcnemar_exact(b, c)


def test_mcnemar_exact_agrees_with_scipy_binomtest() -> None:
    for b, c in [(3, 9), (41, 19), (150, 86), (600, 520), (1, 30)]:
        assert mcnemar_exact(b, c) == pytest.approx(binomtest(min(b, c), b + c, 0.5).pvalue, rel=1e-9)


def test_corpus_wer_is_a_ratio_not_a_mean_of_rates() -> None:
    assert corpus_wer([0, 10], [1, 100]) == pytest.approx(10 / 101)
    with pytest.raises(ValueError, match="no words"):
        corpus_wer([0, 0], [0, 0])
    with pytest.raises(ValueError, match="differ in length"):
        corpus_wer([1, 2], [3])


def _simulated_corpus(rng: np.random.Generator, n: int, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Utterances of 5-40 words whose own error rate varies (Beta around `rate`): errors cluster."""
    words = rng.integers(5, 41, size=n)
    per_utterance = rng.beta(2, 2 * (1 - rate) / rate, size=n)
    return rng.binomial(words, per_utterance), words


def test_bootstrap_wer_interval_covers_true_ratio_at_nominal_rate() -> None:
    rng = np.random.default_rng(1)
    trials, covered = 300, 0
    for trial in range(trials):
        errors, words = _simulated_corpus(rng, 80, 0.1)
        low, high = bootstrap_wer_interval(errors, words, resamples=500, seed=trial)
        covered += low <= 0.1 <= high
    assert 0.89 <= covered / trials <= 0.98  # percentile intervals run ~0.94 at 80 utterances


def test_wer_stderr_matches_bootstrap_spread() -> None:
    errors, words = _simulated_corpus(np.random.default_rng(2), 400, 0.1)
    low, high = bootstrap_wer_interval(errors, words, resamples=4000)
    assert wer_stderr(errors, words) == pytest.approx((high - low) / (2 * 1.96), rel=0.1)


def test_paired_bootstrap_wer_false_alarms_at_alpha_and_covers_true_change() -> None:
    rng = np.random.default_rng(3)
    trials, alarms, covered = 300, 0, 0
    for trial in range(trials):
        words = rng.integers(5, 41, size=80)
        difficulty = rng.beta(2, 18, size=80)  # shared by both runs: that is what pairing exploits
        ref = rng.binomial(words, difficulty)
        same = rng.binomial(words, difficulty)
        worse = rng.binomial(words, difficulty + 0.03)
        alarms += paired_bootstrap_wer(same, ref, words, resamples=500, seed=trial).p_value < 0.05
        test = paired_bootstrap_wer(worse, ref, words, resamples=500, seed=trial)
        covered += test.ci_low <= 0.03 <= test.ci_high
    assert alarms / trials <= 0.09
    assert 0.90 <= covered / trials <= 0.98


def test_paired_bootstrap_wer_identical_runs_and_clear_regression() -> None:
    ref, words = [1, 2, 0, 3] * 25, [10] * 100
    identical = paired_bootstrap_wer(ref, ref, words)
    assert identical.delta == 0.0 and identical.p_value == 1.0
    regressed = paired_bootstrap_wer([e + 1 for e in ref], ref, words)
    assert regressed.delta == pytest.approx(0.1)
    assert regressed.p_value < 0.001 and regressed.ci_low > 0


def test_accuracy_mde_unpaired_is_the_normal_power_formula_at_large_n() -> None:
    k = norm.ppf(0.975) + norm.ppf(0.8)
    p, n = 0.8711, 1319
    assert accuracy_mde(n, p) == pytest.approx(k * math.sqrt(p * (1 - p) / n), rel=0.03)
    assert accuracy_mde(20, p) > 0.08 > accuracy_mde(1319, p)


def test_accuracy_mde_paired_has_the_power_it_claims() -> None:
    """Drops of the paired MDE's size are found by exact McNemar about 80% of the time."""
    n, discordant = 1319, 0.05
    mde = accuracy_mde(n, 0.87, discordant_rate=discordant)
    rng = np.random.default_rng(4)
    found = 0
    for _ in range(400):
        down, up = rng.multinomial(n, [(discordant + mde) / 2, (discordant - mde) / 2, 1 - discordant])[:2]
        found += down > up and mcnemar_exact(int(down), int(up)) < 0.05
    assert 0.72 <= found / 400 <= 0.9


def test_mde_floor_keeps_identical_small_samples_from_claiming_precision() -> None:
    k = norm.ppf(0.975) + norm.ppf(0.8)
    assert accuracy_mde(20, 0.85, discordant_rate=0.0) == pytest.approx(k * k / 20)
    ref, words = [2] * 20, [20] * 20
    assert wer_mde(ref, words, reference_errors=ref) == pytest.approx(k * k / 400)
    assert wer_mde(ref, words, reference_errors=[e + 1 for e in ref]) > wer_mde(ref, words, reference_errors=ref)


def test_accuracy_mde_at_a_perfect_score_is_the_exact_binomial_tests() -> None:
    """Against p = 1 one wrong answer is significant: the MDE makes one likely with 80% power."""
    mde = accuracy_mde(200, 1.0)
    assert mde == pytest.approx(1 - 0.2 ** (1 / 200), rel=1e-6)
    rng = np.random.default_rng(7)
    found = (rng.binomial(200, 1 - mde, size=4000) < 200).mean()
    assert 0.77 <= found <= 0.83
    assert accuracy_mde(200, 1.0) < accuracy_mde(20, 1.0) < accuracy_mde(5, 1.0)


def test_accuracy_mde_at_a_zero_score_is_the_exact_binomial_tests() -> None:
    """From p = 0 nothing can drop; near it no count is significant, so the MDE is all of p."""
    assert accuracy_mde(200, 0.0) == 0.0
    assert accuracy_mde(200, 0.01) == 0.01  # P(0 correct | 0.01) = 0.13 > alpha/2: no drop detectable
    assert 0 < accuracy_mde(200, 0.05) < 0.05
