"""Verdict rules on constructed per-sample rows: sizes and flips chosen to sit on each side of a rule."""

from __future__ import annotations

import itertools

import pytest

from evals.kinds.accuracy import judge_accuracy
from evals.kinds.wer import judge_wer
from evals.stats import accuracy_mde, wer_mde
from evals.verdict import Baseline, MetricJudgement, judge_ab, run_verdict, threshold

GSM8K = Baseline(0.8711, "higher", "absolute", 0.08, "vLLM PR #47671, Kimi-Linear-48B-A3B")
WER = Baseline(0.10, "lower", "absolute", 0.02, "fixture reference")


def _questions(n: int, correct: int) -> dict[str, bool]:
    return {f"q{i:04d}": i < correct for i in range(n)}


def _flip(rows: dict[str, bool], down: int, up: int) -> dict[str, bool]:
    """Copy of `rows` with the first `down` right answers made wrong and the first `up` wrong ones right."""
    out = dict(rows)
    for key in [k for k, v in rows.items() if v][:down]:
        out[key] = False
    for key in [k for k, v in rows.items() if not v][:up]:
        out[key] = True
    return out


def test_threshold_is_vllm_compatible() -> None:
    assert threshold(GSM8K) == pytest.approx(0.7911)
    assert threshold(Baseline(0.8711, "higher", "relative", 0.08)) == pytest.approx(0.8711 * 0.92)
    assert threshold(WER) == pytest.approx(0.12)
    assert threshold(Baseline(0.10, "lower", "relative", 0.1)) == pytest.approx(0.11)
    assert threshold(Baseline(None, "higher", "absolute", 0.08)) is None
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        Baseline(0.5, "higher", "absolute", -0.1)


def test_one_question_change_at_full_gsm8k_passes() -> None:
    reference = _questions(1319, 1149)  # 0.8711
    candidate = _flip(reference, down=1, up=0)  # 0.8704
    for ref in (None, reference):
        j = judge_accuracy("gsm8k", "strict-match", candidate, GSM8K, ref)
        assert j.verdict == "pass", j.explanation
        assert round(j.value, 4) == 0.8704 and j.n == 1319
    assert j.details["flips_down"] == 1 and j.details["flips_up"] == 0 and j.details["p_value"] == 1.0
    assert "1319 of 1319 items" in j.explanation and "1 right->wrong" in j.explanation


def test_drop_of_detectable_size_fails_on_mcnemar_inside_the_tolerance() -> None:
    reference = _questions(1319, 1149)
    candidate = _flip(reference, down=41, up=19)  # net 22 questions, 60 discordant
    mde = accuracy_mde(1319, 1149 / 1319, discordant_rate=60 / 1319)
    assert mde <= 22 / 1319
    j = judge_accuracy("gsm8k", "strict-match", candidate, GSM8K, reference)
    assert j.threshold is not None and j.value > j.threshold  # the 8-point tolerance alone lets it through
    assert j.verdict == "fail"
    assert j.details["p_value"] == pytest.approx(0.0062, abs=1e-4)
    assert "41 right->wrong, 19 wrong->right" in j.explanation and "significant regression" in j.explanation
    noise = judge_accuracy("gsm8k", "strict-match", _flip(reference, down=33, up=27), GSM8K, reference)
    assert noise.verdict == "pass", noise.explanation


def test_twenty_samples_are_inconclusive_and_say_the_mde() -> None:
    candidate = _questions(20, 17)
    for ref in (None, candidate):  # even a reference identical on all 20 cannot vouch for an 8-point window
        j = judge_accuracy("gsm8k", "strict-match", candidate, GSM8K, ref)
        assert j.verdict == "inconclusive", j.explanation
        mde = j.details["mde"]
        assert isinstance(mde, float) and mde > 0.08
        assert f"{mde:.4f}" in j.explanation and "0.0800 the tolerance allows" in j.explanation


def test_broken_tolerance_fails_at_any_size_with_both_reasons() -> None:
    small = judge_accuracy("gsm8k", "strict-match", _questions(20, 15), GSM8K)
    assert small.verdict == "fail" and "below the threshold 0.7911" in small.explanation
    reference = _questions(1319, 1149)
    big = judge_accuracy("gsm8k", "strict-match", _flip(reference, down=200, up=5), GSM8K, reference)
    assert big.verdict == "fail"
    assert "below the threshold" in big.explanation and "200 right->wrong, 5 wrong->right" in big.explanation


def test_no_baseline_cases() -> None:
    rows = _questions(100, 80)
    assert judge_accuracy("gsm8k", "m", rows, None).verdict == "no_baseline"
    valueless = Baseline(None, "higher", "absolute", 0.08)
    assert judge_accuracy("gsm8k", "m", rows, valueless).verdict == "no_baseline"
    disjoint = judge_accuracy("gsm8k", "m", rows, valueless, {"other": True})
    assert disjoint.verdict == "no_baseline" and "shares no items" in disjoint.explanation
    assert run_verdict([]) == "no_baseline"


def test_reference_supplies_the_value_a_baseline_lacks() -> None:
    reference = _questions(1319, 1149)
    j = judge_accuracy("gsm8k", "m", _flip(reference, 1, 0), Baseline(None, "higher", "absolute", 0.08), reference)
    assert j.verdict == "pass"
    assert j.baseline == pytest.approx(1149 / 1319) and j.threshold == pytest.approx(1149 / 1319 - 0.08)
    assert "reference 0.8711 - 0.0800 absolute" in j.explanation


def test_reference_without_baseline_is_judged_by_the_paired_test_alone() -> None:
    reference = _questions(1319, 1149)
    assert judge_accuracy("gsm8k", "m", _flip(reference, 41, 19), None, reference).verdict == "fail"
    ok = judge_accuracy("gsm8k", "m", _flip(reference, 25, 25), None, reference)
    assert ok.verdict == "pass" and ok.threshold is None and "paired test alone" in ok.explanation


def test_inputs_that_cannot_be_judged_are_refused() -> None:
    with pytest.raises(ValueError, match="no samples"):
        judge_accuracy("gsm8k", "m", {}, GSM8K)
    with pytest.raises(ValueError, match="says lower is better"):
        judge_accuracy("gsm8k", "m", _questions(10, 5), WER)
    with pytest.raises(ValueError, match="utterance 'u0' has 20 reference words here but 21"):
        judge_wer("wer", "wer", {"u0": (1, 20)}, WER, {"u0": (1, 21)})


def _utterances(n: int, words: int = 20) -> dict[str, tuple[int, int]]:
    """WER exactly 0.10: errors cycle 0..4 over utterances of `words` words (for words=20)."""
    return {f"u{i:04d}": (i % 5, words) for i in range(n)}


def _add_errors(rows: dict[str, tuple[int, int]], changes: dict[int, int]) -> dict[str, tuple[int, int]]:
    out = dict(rows)
    for index, delta in changes.items():
        key = f"u{index:04d}"
        out[key] = (rows[key][0] + delta, rows[key][1])
    return out


def test_wer_small_change_passes() -> None:
    reference = _utterances(200)
    candidate = _add_errors(reference, {7: 1})
    for ref in (None, reference):
        j = judge_wer("wer", "wer", candidate, WER, ref)
        assert j.verdict == "pass", j.explanation
    assert j.details["utterances_worse"] == 1 and j.details["utterances_better"] == 0


def test_wer_rise_of_detectable_size_fails_inside_the_tolerance() -> None:
    reference = _utterances(200)
    changes = {i: 2 for i in range(0, 200, 10)} | {i: -1 for i in range(1, 200, 20)}  # +40, -10 errors
    candidate = _add_errors(reference, changes)
    keys = sorted(reference)
    mde = wer_mde([candidate[k][0] for k in keys], [20] * 200, reference_errors=[reference[k][0] for k in keys])
    assert mde <= 30 / 4000
    j = judge_wer("wer", "wer", candidate, WER, reference)
    assert j.threshold is not None and j.value < j.threshold
    assert j.verdict == "fail", j.explanation
    assert j.details["utterances_worse"] == 20 and j.details["utterances_better"] == 10
    assert "paired bootstrap p=" in j.explanation and "significant regression" in j.explanation


def test_wer_twenty_utterances_are_inconclusive_and_broken_tolerance_fails() -> None:
    j = judge_wer("wer", "wer", _utterances(20), WER)
    assert j.verdict == "inconclusive", j.explanation
    assert "2.00 points the tolerance allows" in j.explanation
    bad = judge_wer("wer", "wer", {k: (v[0] + 3, v[1]) for k, v in _utterances(20).items()}, WER)
    assert bad.verdict == "fail" and "above the threshold 12.00%" in bad.explanation


def test_wer_verdict_is_reproducible_whatever_the_key_order() -> None:
    reference = _utterances(200)
    candidate = _add_errors(reference, {i: 1 for i in range(0, 200, 25)})
    reordered = dict(reversed(list(candidate.items())))
    first = judge_wer("wer", "wer", candidate, WER, reference)
    assert first == judge_wer("wer", "wer", reordered, WER, reference)


def test_ab_prefers_the_arm_that_is_not_broken() -> None:
    stock = _flip(_questions(1319, 1149), down=285, up=0)  # requests that failed count as wrong
    fixed = _questions(1319, 1149)
    good = judge_ab("gsm8k", "strict-match", judge_accuracy, stock, fixed, control_label="stock")
    assert good.verdict == "pass" and "significant improvement" in good.explanation
    assert "Against the stock arm on 1319 of 1319 items" in good.explanation
    bad = judge_ab("gsm8k", "strict-match", judge_accuracy, fixed, stock, baseline=GSM8K)
    assert bad.verdict == "fail" and "below the threshold" in bad.explanation
    wer = judge_ab("wer", "wer", judge_wer, _utterances(200), _add_errors(_utterances(200), {3: 1}), baseline=WER)
    assert wer.verdict == "pass", wer.explanation
    with pytest.raises(ValueError, match="share no items"):
        judge_ab("gsm8k", "m", judge_accuracy, {"a": True}, {"b": True})


def _judgement(verdict: str) -> MetricJudgement:
    return MetricJudgement("s", "m", verdict, 0.5, 10, None, None, "", {})  # type: ignore[arg-type]


def test_run_verdict_is_the_worst_metric() -> None:
    order = ["pass", "no_baseline", "inconclusive", "fail"]
    for size in range(1, 5):
        for combo in itertools.combinations_with_replacement(order, size):
            expected = max(combo, key=order.index)
            assert run_verdict([_judgement(v) for v in combo]) == expected


def test_vllm_rule_is_said_beside_kvcanarys_verdict() -> None:
    """A vLLM config's baseline (relative, rtol 0.08): vLLM passes a detectable drop that McNemar fails."""
    vllm_config = Baseline(0.756, "higher", "relative", 0.08, "vLLM lm-eval config Meta-Llama-3-8B-Instruct.yaml")
    reference = _questions(1319, 997)  # 0.7559
    dropped = _flip(reference, down=60, up=0)  # 0.7104, above 0.756 * 0.92 = 0.6955
    j = judge_accuracy("lm-eval", "gsm8k:exact_match,strict-match", dropped, vllm_config, reference)
    assert j.verdict == "fail" and j.details["vllm_rule"] == "pass"
    assert "vLLM's own rule (measured >= 0.756 * (1 - 0.08) = 0.6955) would have passed it." in j.explanation
    broken = judge_accuracy("lm-eval", "gsm8k:exact_match,strict-match", _questions(100, 60), vllm_config)
    assert broken.verdict == "fail" and broken.details["vllm_rule"] == "fail"
    assert "would have failed it" in broken.explanation
    # Absolute tolerances and lower-is-better metrics are kvcanary's own rules: no vLLM sentence.
    assert judge_accuracy("gsm8k", "strict-match", _questions(100, 90), GSM8K).details["vllm_rule"] is None
    assert "vLLM's own rule" not in judge_accuracy("gsm8k", "strict-match", _questions(100, 90), GSM8K).explanation


def test_a_perfect_score_reports_the_exact_tests_mde() -> None:
    perfect = _questions(200, 200)
    j = judge_accuracy("gsm8k", "m", perfect, Baseline(1.0, "higher", "absolute", 0.01))
    assert j.verdict == "pass" and j.details["mde"] == pytest.approx(1 - 0.2 ** (1 / 200))
    assert "smallest regression it detects is 0.0080" in j.explanation
    tight = judge_accuracy("gsm8k", "m", perfect, Baseline(1.0, "higher", "absolute", 0.005))
    assert tight.verdict == "inconclusive" and "0.0080" in tight.explanation
