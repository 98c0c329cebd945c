"""The invariance comparison and verdict on hand-built observations and per-prompt rows.

Rows are what the suite stores per prompt and condition; the verdict must name the condition
that broke, hold each condition to its own floor, and report skipped conditions with reasons.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from evals.invariance import Observation, judge_invariance, observe, row, skipped
from evals.invariance_conditions import InvarianceConfig
from evals.kinds.invariance import KIND as INVARIANCE
from evals.kinds.invariance import diff_invariance
from evals.logprob_drift import PromptDrift
from evals.records import Sample
from evals.verdict import Baseline

PROMPT_LEN = 10


def _top(*pairs: tuple[int, float]) -> dict[int, float]:
    return {token: math.log(p) for token, p in pairs}


def _obs(tokens: list[int], shift: float = 0.0, flip: set[int] | None = None) -> Observation:
    """Top-2 at every position from 1: the next token first (0.7 - shift), unless `flip` swaps the two."""
    tops = {}
    for t in range(1, len(tokens)):
        first, second = tokens[t], tokens[t] + 1
        if flip and t in flip:
            first, second = second, first
        tops[t] = _top((first, 0.7 - shift), (second, 0.2 + shift))
    return Observation(tokens, tops)


def test_observe_compares_only_positions_whose_preceding_tokens_agree() -> None:
    seq = list(range(100, 116))
    same, n = observe(_obs(seq), _obs(seq))
    assert n == 15 and same.mean_kl == 0.0 and same.first_divergence is None and same.argmax_agreement == 1.0
    shifted, _ = observe(_obs(seq), _obs(seq, shift=0.2))
    assert shifted.mean_kl > 0.05 and shifted.first_divergence is None and shifted.max_abs_dlogprob > 0.1
    # a decode that chose another token at 12: positions up to 12 compare, none after
    other = [*seq[:12], 999, 998, 997, 996]
    parted, n = observe(_obs(seq), _obs(other, flip=set()), since=PROMPT_LEN)
    assert n == 3 and parted.first_divergence == 12 and not parted.close
    near, _ = observe(_obs(seq), _obs(seq, flip={4}))
    assert near.first_divergence == 4 and near.close  # each argmax is in the other's top-k


def test_a_nan_or_an_unanswered_request_is_not_finite() -> None:
    seq = list(range(10))
    broken = _obs(seq)
    broken.tops[3][seq[3]] = math.nan  # type: ignore[index]
    assert not observe(_obs(seq), broken)[0].finite
    assert not observe(_obs(seq), Observation(seq, {}, answered=False))[0].finite


def _drift(kl: float = 0.0, first: int | None = None, close: bool = True, finite: bool = True) -> PromptDrift:
    return PromptDrift(first, close, 0.0, kl, kl * 2, 1.0 if first is None else 0.9, 0.0, finite)


def _rows(conditions: dict[str, list[dict[str, Any]]], n: int = 16) -> dict[str, Any]:
    """key -> a stored prompt row with the given condition rows (one list entry per prompt)."""
    return {
        f"p{i:02d}": {
            "conditions": {name: rows[i] for name, rows in conditions.items()},
            "prompt_len": PROMPT_LEN,
            "kl_tolerance": 0.01,
            "tolerances": {},
            "seconds": {name: 0.5 for name in conditions},
        }
        for i in range(n)
    }


def _same(n: int = 16, floor_kl: float = 0.0, kl: float = 0.0) -> list[dict[str, Any]]:
    return [row((_drift(kl + 1e-4 * (i % 2)), 20), (_drift(floor_kl + 1e-4 * (i % 2)), 20)) for i in range(n)]


def test_every_condition_at_its_floor_passes_and_says_how_long_each_took() -> None:
    judged = judge_invariance(
        "invariance", "kl", _rows({"decode_prefill": _same(), "prefix_hit": _same(), "batch": _same()}), None
    )
    assert judged.verdict == "pass", judged.explanation
    assert judged.explanation.startswith("PASS: invariance holds under every condition it built (3)")
    assert "prefix-cache hits (pass" in judged.explanation and "Time per condition: " in judged.explanation
    assert judged.details["prefix_hit.seconds"] == 8.0  # 16 prompts x 0.5 s


def test_a_condition_that_breaks_is_named_with_its_count_and_first_position() -> None:
    broken = [
        row((_drift(0.4, first=PROMPT_LEN + 3 + i % 2, close=False), 6), (_drift(), 6)) if i < 14 else _same(1)[0]
        for i in range(16)
    ]
    judged = judge_invariance("invariance", "kl", _rows({"decode_prefill": _same(), "prefix_hit": broken}), None)
    assert judged.verdict == "fail"
    assert judged.explanation.startswith(
        "FAIL: invariance diverges only on prefix-cache hits: 14 of 16 prompts, first at continuation token 3."
    ), judged.explanation
    assert judged.details["failed_conditions"] == "prefix_hit" and judged.details["decided_by"] == "prefix_hit"
    assert judged.details["decode_prefill.verdict"] == "pass"


def test_batch_composition_is_held_to_its_own_floor_not_to_zero() -> None:
    """Alone vs batch moves the numbers by as much as two batches differ: that is its floor, a pass.
    The same drift against a zero floor fails."""
    noisy = _same(floor_kl=0.005, kl=0.005)
    judged = judge_invariance("invariance", "kl", _rows({"batch": noisy}), None)
    assert judged.verdict == "pass", judged.explanation
    assert "held to its own measured floor, not to zero" in judged.explanation
    assert judged.details["batch.floor_mean_kl"] == pytest.approx(0.005, abs=1e-3)
    against_zero = judge_invariance("invariance", "kl", _rows({"batch": _same(kl=0.05)}), None)
    assert against_zero.verdict == "fail" and "diverges on batch composition" in against_zero.explanation


def test_an_engine_arm_gets_its_own_decode_margin_and_a_misnamed_condition_is_refused() -> None:
    """CUDA graphs compile the whole model, so an arm that turns them on moves decode logprobs by
    ~1.5e-3 nats with correct kernels: over the default 1e-3 margin, inside a per-condition one."""
    moved = [
        row((PromptDrift(None, True, 2e-3 + 1e-4 * (i % 3), 1e-5, 2e-5, 1.0, 0.0, True), 20), (_drift(), 20))
        for i in range(16)
    ]
    rows = _rows({"decode_prefill": _same(), "arm": moved})
    failed = judge_invariance("invariance", "kl", rows, None)
    assert failed.details["arm.verdict"] == "fail" and failed.details["arm.dlogprob_verdict"] == "fail"
    # the decode numbers travel per condition, and the headline says decode, not a KL that did not move
    assert failed.details["arm.dlogprob_excess"] == pytest.approx(2.1e-3, rel=0.05)
    assert (
        failed.details["arm.dlogprob_ci_low"]
        < failed.details["arm.dlogprob_excess"]
        < failed.details["arm.dlogprob_ci_high"]
    )
    assert (
        "diverges only on the engine change between arms: decode |delta logprob| 0.00209 nats over its floor"
        in failed.explanation
    ), failed.explanation
    assert failed.details["decode_prefill.dlogprob_verdict"] == "pass"
    # when the KL fails too, the headline keeps the KL (the larger sense), not the decode number
    both = [
        row((PromptDrift(None, True, 2e-3 + 1e-4 * (i % 3), 5e-2 + 1e-4 * (i % 2), 6e-2, 1.0, 0.0, True), 20),
            (_drift(), 20))
        for i in range(16)
    ]  # fmt: skip
    judged_both = judge_invariance("invariance", "kl", _rows({"decode_prefill": _same(), "arm": both}), None)
    assert judged_both.details["arm.dlogprob_verdict"] == "fail" and judged_both.verdict == "fail"
    assert "the engine change between arms: mean KL 0.0501 nats over its floor's 0" in judged_both.explanation, (
        judged_both.explanation
    )
    for r in rows.values():
        r["dlogprob_tolerances"] = {"arm": 5e-3}
    judged = judge_invariance("invariance", "kl", rows, None)
    assert judged.details["arm.verdict"] == "warn" and judged.verdict == "warn", judged.explanation
    config = InvarianceConfig.model_validate({"dlogprob_tolerances": {"arm": 5e-3}})
    assert config.dlogprob_tolerances == {"arm": 5e-3}
    with pytest.raises(ValueError, match="no condition named prefix_hits"):
        InvarianceConfig.model_validate({"tolerances": {"prefix_hits": 1e-3}})


def test_conditions_that_cannot_be_built_are_skipped_with_their_reasons() -> None:
    off = "the engine serves without prefix caching (/metrics vllm:cache_config_info enable_prefix_caching=False)"
    too_long = [skipped("too long for a preamble: ...") if i < 3 else _same(1)[0] for i in range(16)]
    rows = _rows({"decode_prefill": _same(), "prefix_hit": [skipped(off)] * 16, "long_context": too_long})
    judged = judge_invariance("invariance", "kl", rows, None)
    assert judged.verdict == "pass"
    assert f"prefix-cache hits for 16 of 16 prompts: {off}" in judged.explanation
    assert "long context for 3 of 16 prompts: too long for a preamble" in judged.explanation
    assert judged.details["long_context.prompts"] == 13 and "prefix_hit.prompts" not in judged.details
    nothing = judge_invariance("invariance", "kl", _rows({"prefix_hit": [skipped(off)] * 16}), None)
    assert nothing.verdict == "inconclusive" and off in nothing.explanation


def test_non_finite_logprobs_fail_the_condition_that_produced_them() -> None:
    nan = [row((_drift(finite=False), 0), (_drift(), 20))] * 16
    judged = judge_invariance("invariance", "kl", _rows({"decode_prefill": _same(), "long_context": nan}), None)
    assert judged.verdict == "fail"
    assert "diverges only on long context: 16 of 16 prompts have non-finite logprobs" in judged.explanation
    # never "mean KL 0": the condition has no KL at all, and every report says so
    assert "long context (fail; " in judged.explanation and "mean KL not finite" in judged.explanation
    sentence = judged.explanation.split("long context (")[1]
    assert "max KL not finite" in sentence and "mean KL 0 nats" not in sentence
    assert judged.details["long_context.mean_kl"] is None and judged.details["kl_finite"] is False
    assert judged.value == math.inf and INVARIANCE.display(1e30, judged.details, "-") == "not finite"
    assert INVARIANCE.plotted(1e30, judged.details) is None
    half = [row((_drift(finite=i % 2 == 0, kl=1e-6), 20), (_drift(), 20)) for i in range(16)]
    partial = judge_invariance("invariance", "kl", _rows({"batch": half}), None)
    assert "over its 8 finite prompts" in partial.explanation
    assert partial.details["batch.mean_kl"] == pytest.approx(1e-6)


def test_a_floor_past_the_tolerance_is_named_as_the_arm_not_reproducing_itself() -> None:
    """A bug on both sides of a floor (a batch-dependent page read, in the alone-vs-batch drift and in
    the two-batches floor alike) leaves a wide excess: inconclusive, and the reason is the floor, not
    too few prompts. Where the excess happens to fall inside the margin the condition is not a pass
    either: nothing is within a tolerance of a floor that itself moves past it."""
    both = [row((_drift(0.5 * ((i * 7) % 16) / 16), 20), (_drift(0.5 * (i % 16) / 16), 20)) for i in range(16)]
    judged = judge_invariance("invariance", "kl", _rows({"batch": both, "prefix_hit": _same()}), None)
    assert judged.verdict == "inconclusive", judged.explanation
    assert judged.explanation.startswith(
        "INCONCLUSIVE: invariance found no divergence beyond the floors, but under batch composition, the floor "
        "itself (the condition repeated) moves past the tolerance"
    ), judged.explanation
    assert "more prompts would not make a pass trustworthy" in judged.explanation
    assert "add prompts" not in judged.explanation
    assert float(judged.details["batch.floor_ci_low"] or 0) > 0.01  # the rows' tolerance
    assert float(judged.details["prefix_hit.floor_ci_high"] or 0) <= 1e-4
    batch_text, hit_text = judged.explanation.split("prefix-cache hits (")
    assert "its floor itself moves" in batch_text and "its floor itself moves" not in hit_text
    steady_excess = judge_invariance("invariance", "kl", _rows({"batch": _same(floor_kl=0.05, kl=0.05)}), None)
    assert steady_excess.verdict == "inconclusive" and steady_excess.details["batch.verdict"] == "inconclusive"
    looser = Baseline(value=0.0, direction="lower", tolerance=1.0, tolerance_kind="absolute")
    assert judge_invariance("invariance", "kl", _rows({"batch": both}), looser).details["batch.verdict"] in (
        "pass",
        "warn",
    )
    few = judge_invariance("invariance", "kl", _rows({"batch": both[:4], "decode_prefill": both}, n=4), None)
    assert "add prompts to decide" in few.explanation and "the floor itself" not in few.explanation


def test_a_condition_too_spread_and_one_with_a_moved_floor_are_both_named() -> None:
    moved = [row((_drift(0.5 * ((i * 7) % 16) / 16), 20), (_drift(0.5 * (i % 16) / 16), 20)) for i in range(16)]
    spread = [row((_drift(0.12 if i == 0 else 0.0), 20), (_drift(0.0), 20)) for i in range(16)]
    judged = judge_invariance("invariance", "kl", _rows({"batch": moved, "prefix_hit": spread}), None)
    assert judged.verdict == "inconclusive", judged.explanation
    assert "under prefix-cache hits the prompts were too few (or too spread)" in judged.explanation
    assert "add prompts to decide; under batch composition, the floor itself" in judged.explanation


def test_few_prompts_are_inconclusive_not_pass() -> None:
    judged = judge_invariance("invariance", "kl", _rows({"batch": _same(4)}, n=4), None)
    assert judged.verdict == "inconclusive" and "add prompts" in judged.explanation


def _sample(key: str, conditions: dict[str, Any], finite: bool = True) -> Sample:
    data = {"conditions": conditions, "prompt_len": PROMPT_LEN, "finite": finite, "kl_tolerance": 0.01}
    return Sample(key=key, prompt_hash=key, target="", response="", data=data)


def test_the_kind_flags_moved_prompts_orders_by_excess_and_diffs_by_condition() -> None:
    steady = row((_drift(0.001), 9), (_drift(0.001), 9))
    moved = row((_drift(0.3, first=12), 9), (_drift(0.001), 9))
    a = {"p0": _sample("p0", {"prefix_hit": steady}), "p1": _sample("p1", {"prefix_hit": steady})}
    b = {"p0": _sample("p0", {"prefix_hit": moved}), "p1": _sample("p1", {"prefix_hit": steady, "batch": steady})}
    assert INVARIANCE.passed(a["p0"], "kl") is True and INVARIANCE.passed(b["p0"], "kl") is False
    assert INVARIANCE.severity(b["p0"], "kl") == pytest.approx(0.299)
    assert INVARIANCE.severity(_sample("p2", {}, finite=False), "kl") == 1e30
    assert INVARIANCE.passed(Sample(key="x", prompt_hash="x", target="", response=""), "kl") is None
    found = diff_invariance(a, b)
    assert found is not None and found.matched == 2
    [change] = found.conditions  # batch is in run b only: nothing to compare
    assert (change.condition, change.diverged_a, change.diverged_b, change.newly_diverged) == (
        "prefix_hit",
        0,
        1,
        ["p0"],
    )
