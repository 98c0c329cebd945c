"""Per-token drift between two arms, on hand-built outputs (the verdict: test_drift_verdict.py)."""

from __future__ import annotations

import math

import pytest

from evals.logprob_drift import ArmOutput, compare, kl_topk


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
    found = compare(ref, broken)
    assert not found.finite and found.nonfinite_positions == 1
    # not computable is None, never 0 (a NaN model once read "mean KL 0")
    assert found.mean_kl is None and found.max_kl is None and found.mean_abs_dlogprob is None


def test_a_pass_the_server_could_not_serialise_counts_its_positions() -> None:
    """vLLM answers 400 for a NaN logprob; the suite then keeps the tokens with NaN logprobs and
    one NaN for the teacher-forced pass: every such step is counted."""
    ref = _arm([1, 2, 3])
    lost = ArmOutput(ref.tokens, [math.nan] * 3, [{} for _ in range(3)], [], [math.nan])
    found = compare(ref, lost)
    assert not found.finite and found.nonfinite_positions == 4 and found.mean_kl is None


def test_positions_split_into_shared_header_varying_prompt_and_answer() -> None:
    """The shared header's KL is reported apart and left out of `mean_kl` (it is the same
    computation in every prompt: 88-97% of the KL the suite once scored came from it)."""
    ref = _arm([10, 20, 30, 40])
    header_only = [_top((7, 0.3), (8, 0.6)) if i < 6 else _top((7, 0.6), (8, 0.3)) for i in range(10)]
    cand = ArmOutput(ref.tokens, ref.logprobs, ref.top, header_only, ref.prefill_logprobs)
    found = compare(ref, cand, shared=6, prompt_len=8)
    assert (found.shared_positions, found.prompt_positions, found.answer_positions) == (6, 1, 3)
    assert found.shared_kl is not None and found.shared_kl > 0.1
    assert found.mean_kl == 0.0 and found.prompt_kl == 0.0 and found.answer_kl == 0.0
    assert found.argmax_agreement == 1.0  # over the varying positions; the header's flipped
    answer_only = [_top((7, 0.6), (8, 0.3)) if i < 7 else _top((7, 0.3), (8, 0.6)) for i in range(10)]
    moved = compare(ref, ArmOutput(ref.tokens, ref.logprobs, ref.top, answer_only, ref.prefill_logprobs), 6, 8)
    assert moved.shared_kl == 0.0 and moved.prompt_kl == 0.0 and moved.answer_kl == pytest.approx(moved.max_kl)
    assert moved.mean_kl == pytest.approx(moved.answer_kl * 3 / 4)


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
