"""Per-token drift between two arms and its verdict against the A/A floor, on hand-built outputs."""

from __future__ import annotations

import math
from typing import Any

import pytest

from evals.logprob_drift import ArmOutput, PromptDrift, clustered_mean_interval, compare, judge_drift, kl_topk


def _top(*pairs: tuple[int, float]) -> dict[int, float]:
    return {token: math.log(p) for token, p in pairs}


def _arm(tokens: list[int], shift: float = 0.0, swap_at: int | None = None) -> ArmOutput:
    """Greedy tokens with a top-2 per step; `shift` moves the second token's mass, `swap_at` flips the argmax."""
    top = []
    chosen = []
    for i, token in enumerate(tokens):
        first, second = (0.7 - shift, 0.2 + shift) if i != swap_at else (0.2, 0.7)
        top.append(
            _top((token, first), (token + 1, second)) if i != swap_at else _top((token - 1, second), (token, first))
        )
        chosen.append(math.log(first))
    prefill = [_top((7, 0.6 - shift), (8, 0.3 + shift)) for _ in range(10)]
    return ArmOutput(tokens, chosen, top, prefill, [math.log(0.6 - shift)] * 10)


def test_kl_is_zero_for_identical_distributions_and_matches_the_bucketed_formula() -> None:
    ref = _top((1, 0.6), (2, 0.3))
    assert kl_topk(ref, ref) == pytest.approx(0.0, abs=1e-12)
    cand = _top((1, 0.5), (2, 0.4))
    expected = 0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(0.3 / 0.4) + 0.1 * math.log(0.1 / 0.1)
    assert kl_topk(ref, cand) == pytest.approx(expected)
    # a reference token the candidate did not list gets at most its smallest listed probability
    assert kl_topk(ref, _top((1, 0.6), (3, 0.35))) > kl_topk(ref, cand)


def test_compare_finds_the_first_divergence_and_the_close_rule() -> None:
    ref = _arm([10, 20, 30, 40])
    same = compare(ref, _arm([10, 20, 30, 40]))
    assert same.first_divergence is None and same.close and same.mean_kl == 0.0 and same.argmax_agreement == 1.0
    near = compare(ref, _arm([10, 21, 31, 41], swap_at=1))  # each token is the other's second choice
    assert near.first_divergence == 1 and near.close
    far = compare(ref, _arm([10, 99, 100, 101]))
    assert far.first_divergence == 1 and not far.close
    drifted = compare(ref, _arm([10, 20, 30, 40], shift=0.2))
    assert drifted.first_divergence is None and drifted.mean_kl > 0.05 and drifted.mean_abs_dlogprob > 0.1
    shorter = compare(ref, _arm([10, 20]))
    assert shorter.first_divergence == 2 and not shorter.close


def test_a_nan_logprob_is_not_finite() -> None:
    ref = _arm([1, 2, 3])
    broken = ArmOutput(
        ref.tokens, [ref.logprobs[0], math.nan, ref.logprobs[2]], ref.top, ref.prefill_top, ref.prefill_logprobs
    )
    assert not compare(ref, broken).finite


def _rows(n: int, kl: float, floor_kl: float = 0.0, **drift: Any) -> dict[str, dict[str, Any]]:
    floor = PromptDrift(None, True, 0.0, floor_kl, floor_kl, 1.0, 0.0, True).as_dict()
    rows = {}
    for i in range(n):
        d = PromptDrift(None, True, 0.0, kl * (1 + 0.1 * (i % 3)), kl * 2, 1.0, 0.1, True).as_dict()
        d.update(drift)
        rows[f"p{i:02d}"] = {"floor": floor, "drift": d, "finite": d["finite"], "kl_tolerance": 0.01}
    return rows


def test_judge_passes_at_the_floor_and_fails_over_it_naming_kl() -> None:
    at_floor = judge_drift("drift", "kl", _rows(30, 0.0), None)
    assert at_floor.verdict == "pass", at_floor.explanation
    assert "A/A floor" in at_floor.explanation and "mean KL" in at_floor.explanation
    over = judge_drift("drift", "kl", _rows(30, 0.2), None)
    assert over.verdict == "fail" and "KL lower bound" in over.explanation
    assert over.details["ci_low"] > over.details["threshold"]


def test_judge_fails_on_non_finite_and_close_rule_violations_and_names_positions() -> None:
    nan = judge_drift("drift", "kl", _rows(30, 0.0, finite=False), None)
    assert nan.verdict == "fail" and "non-finite" in nan.explanation
    broken = judge_drift("drift", "kl", _rows(30, 0.0, close=False, first_divergence=3), None)
    assert broken.verdict == "fail" and "close-rule violations exceed the floor's 0" in broken.explanation
    assert "p00@3" in broken.explanation


def test_judge_is_inconclusive_with_the_mde_in_kl_when_prompts_are_too_few() -> None:
    few = judge_drift("drift", "kl", _rows(3, 0.004), None)
    assert few.verdict == "inconclusive" and "add prompts" in few.explanation
    assert f"{few.details['mde']:.3g}" in few.explanation
    one = judge_drift("drift", "kl", _rows(1, 0.5), None)  # a large KL on one prompt has no spread to judge
    assert one.verdict == "inconclusive" and "fewer than 8 prompts" in one.explanation


def test_the_reference_arm_alone_reports_its_floor() -> None:
    rows = {k: {**v, "drift": None} for k, v in _rows(5, 0.0, floor_kl=0.001).items()}
    alone = judge_drift("drift", "kl", rows, None)
    assert alone.verdict == "no_baseline" and "0.001" in alone.explanation


def test_clustered_interval_covers_the_mean() -> None:
    low, high = clustered_mean_interval([0.0, 0.1, 0.2, 0.3] * 5)
    assert low < 0.15 < high


def test_edge_lengths_leave_room_for_the_teacher_forced_pass() -> None:
    """The teacher-forced pass sends prompt + continuation and asks for one more token: an
    MLA model with 1,024 positions and 480-token pages once got a 1,024-token prompt (HTTP 400)."""
    from evals.suites.drift import edge_lengths, fits

    assert edge_lengths(480, 64, 1024) == {}
    assert edge_lengths(480, 63, 1024) == {"prefill-mod0": 960}
    assert fits(960, 63, 1024) and not fits(960, 64, 1024)
    lengths = edge_lengths(16, 64, 4096)
    assert set(lengths) == {"prefill-mod0", "prefill-mod1", "prefill-mod15", "decode-cross"}
    assert [lengths[k] % 16 for k in ("prefill-mod0", "prefill-mod1", "prefill-mod15")] == [0, 1, 15]
