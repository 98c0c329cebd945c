"""Argument checks of the vLLM-facing entry points: what is refused, and why, by name.

vLLM passes many keyword arguments for features these kernels do not implement; each one
that would change the result is refused with an error that names it.
"""

from typing import Any

import torch


def refuse_unsupported_unified(causal: Any, q_descale: Any, extra: dict[str, Any]) -> None:
    """Raise for every vLLM feature this kernel does not implement, naming it."""
    if isinstance(causal, torch.Tensor):
        raise NotImplementedError("unified_attention: per-sequence causal flags (a tensor) are not supported")
    if q_descale is not None:
        raise NotImplementedError("unified_attention: fp8 queries (q_descale) are not supported")
    defaults = {
        "alibi_slopes": None,
        "output_scale": None,
        "qq_bias": None,
        "sinks": None,
        "mm_prefix_range": None,
        "rswa_prefix_lens": None,
        "rswa_window": None,
        "use_alibi_sqrt": False,
        "k_scale_cache": None,
        "v_scale_cache": None,
        "chunk_lookback": -1,
    }
    for name, default in defaults.items():
        value = extra[name]
        if (value is not None) if default is None else (value != default):
            raise NotImplementedError(f"unified_attention: {name}={value!r} is not supported (expected {default!r})")
    if int(extra["kv_quant_mode"]) != 0:
        raise NotImplementedError(
            f"unified_attention: quantized KV cache (kv_quant_mode={extra['kv_quant_mode']!r}) is not supported"
        )


def check_unified_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    if k.dim() != 4 or v.shape != k.shape:
        raise ValueError(
            "unified_attention: k and v must both be [num_blocks, block_size, num_kv_heads, head_size], "
            f"got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if q.dim() != 3 or q.shape[2] != k.shape[3] or out.shape != q.shape:
        raise ValueError(
            f"unified_attention: q and out must be [num_tokens, num_heads, {k.shape[3]}], "
            f"got {tuple(q.shape)} and {tuple(out.shape)}"
        )
    if q.shape[1] % k.shape[2]:
        raise ValueError(f"unified_attention: {q.shape[1]} query heads are not a multiple of {k.shape[2]} KV heads")
    if k.dtype != q.dtype or v.dtype != q.dtype or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise NotImplementedError(
            f"unified_attention: q/k/v must share one of fp16, bf16, fp32 (fp8 KV is not supported), "
            f"got {q.dtype}/{k.dtype}/{v.dtype}"
        )
    if q.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("unified_attention: q and out need a contiguous last dimension")


def page_geometry(buf: torch.Tensor, page_size: int, name: str) -> tuple[int, int, int]:
    """(page, position, head) strides of a ``[pages, page_size, heads, dim]`` buffer, or of a
    ``[tokens, heads, dim]`` buffer whose pages are packed along the token axis."""
    if buf.stride(-1) != 1:
        raise ValueError(f"decode_attention_fwd: {name} needs a contiguous last dimension, strides {buf.stride()}")
    if buf.dim() == 4:
        if buf.shape[1] != page_size:
            raise ValueError(f"decode_attention_fwd: {name} pages hold {buf.shape[1]} tokens, page_size={page_size}")
        return buf.stride(0), buf.stride(1), buf.stride(2)
    if buf.dim() == 3:
        return buf.stride(0) * page_size, buf.stride(0), buf.stride(1)
    raise ValueError(f"decode_attention_fwd: {name} must be 3D or 4D, got shape {tuple(buf.shape)}")


def check_decode_args(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    attn_logits: torch.Tensor,
    num_kv_splits: int,
    is_mla: bool,
) -> None:
    lk, lv = k_buffer.shape[-1], v_buffer.shape[-1]
    if q.dim() != 3 or q.shape[2] != lk or q.stride(-1) != 1:
        raise ValueError(f"decode_attention_fwd: q must be [batch, heads, {lk}] with a contiguous last dim")
    if q.shape[1] % k_buffer.shape[-2]:
        raise ValueError(f"decode_attention_fwd: {q.shape[1]} query heads vs {k_buffer.shape[-2]} KV heads")
    if tuple(o.shape) != (q.shape[0], q.shape[1], lv) or o.stride(-1) != 1:
        raise ValueError(f"decode_attention_fwd: o must be [batch, heads, {lv}] with a contiguous last dim")
    expected = (q.shape[0], q.shape[1], num_kv_splits, lv + 1)
    if tuple(attn_logits.shape) != expected or attn_logits.dtype != torch.float32:
        raise ValueError(
            f"decode_attention_fwd: attn_logits must be float32 {expected}, got {tuple(attn_logits.shape)}"
        )
    if k_buffer.dtype != q.dtype or v_buffer.dtype != q.dtype:
        raise NotImplementedError(
            f"decode_attention_fwd: KV dtype {k_buffer.dtype} differs from q {q.dtype} (fp8 KV is not supported)"
        )
    if is_mla and (v_buffer.data_ptr() != k_buffer.data_ptr() or v_buffer.stride() != k_buffer.stride() or lv > lk):
        raise ValueError("decode_attention_fwd: with is_mla, v_buffer must be the leading columns of k_buffer")


def check_unit_scale(scale: torch.Tensor | float | None, name: str) -> None:
    """Scales only matter for fp8 KV (refused); a host number other than 1 is refused too.

    A device tensor is not read back: that would stall the stream and break CUDA graphs.
    """
    if isinstance(scale, (int, float)) and scale != 1.0:
        raise NotImplementedError(f"decode_attention_fwd: {name}={scale} (fp8 KV scaling) is not supported")
