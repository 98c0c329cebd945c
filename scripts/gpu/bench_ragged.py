"""The ragged-batch table of the kernel benchmark on a GPU: kvcanary's kernels (fixed and
legacy), vLLM 0.24's Triton kernels and the kernels vLLM runs by default on Hopper
(FA3 for GQA, FlashMLA for MLA at page 64) on identical inputs, each called the way vLLM's
call site calls it. The cases and the table are in ragged_batches.py."""

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch
import triton
from cuda_timing import DEVICE, DTYPE, paired_ms
from ragged_batches import RaggedCase, ragged_cases, ragged_page_table, ragged_row, sweep_configs
from vllm_ref import Peers, vllm_unified_decode

from kernels._launch import LaunchConfig, sm_count
from kernels.decode_attention import decode_attention_fwd
from kernels.reference import decode_attention_reference, relative_error, unified_attention_reference
from kernels.unified_attention import unified_attention

VllmTriton = tuple[ModuleType | None, ModuleType | None]  # vLLM's unified and decode modules
Ours = Callable[[str, LaunchConfig | None], Callable[[], torch.Tensor]]  # our kernel by variant and launch

FA3_NUM_SPLITS = 32  # vLLM 0.24's flash_attn_max_num_splits_for_cuda_graph: what decode under graphs gets


def gqa_case_fns(
    case: RaggedCase, vllm_unified: ModuleType | None, peers: Peers
) -> tuple[dict[str, Callable[[], torch.Tensor]], torch.Tensor, Ours]:
    """Each kernel as a call returning its output, on one GQA batch, and the float64 reference."""
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    table, num_pages = ragged_page_table(case.lengths, case.page, torch.Generator().manual_seed(5))
    table = table.to(DEVICE)
    shape = (num_pages, 2, case.page, case.kv_heads, case.head_size)
    kv = torch.randn(*shape, generator=gen, device=DEVICE, dtype=DTYPE)
    k, v = kv.unbind(1)
    num_seqs, max_len = len(case.lengths), max(case.lengths)
    q = torch.randn(num_seqs, case.q_heads, case.head_size, generator=gen, device=DEVICE, dtype=DTYPE)
    cu = torch.arange(num_seqs + 1, dtype=torch.int32, device=DEVICE)
    lens = torch.tensor(case.lengths, dtype=torch.int32, device=DEVICE)
    scale = case.head_size**-0.5
    expected = unified_attention_reference(q, k, v, cu, lens, table, scale, True)
    out = torch.empty_like(q)

    def ours(variant: str, config: LaunchConfig | None = None) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            unified_attention(
                q, k, v, out, cu, 1, lens, max_len, scale, True, (-1, -1), table, 0.0, None, None, None,
                variant=variant, config=config,
            )  # fmt: skip
            return out

        return run

    fns = {"fixed": ours("fixed"), "legacy": ours("legacy")}
    if vllm_unified is not None:
        theirs = vllm_unified_decode(vllm_unified, q, k, v, out, cu, lens, max_len, scale, table)

        def vllm_run() -> torch.Tensor:
            theirs()
            return out

        fns["vllm"] = vllm_run
    if peers.fa3 is not None:
        fa3 = peers.fa3
        # As vLLM's FLASH_ATTN backend under full CUDA graphs: an ahead-of-time schedule
        # and at most 32 splits (its metadata builder calls get_scheduler_metadata per step).
        metadata = fa3.get_scheduler_metadata(
            batch_size=num_seqs, max_seqlen_q=1, max_seqlen_k=max_len, num_heads_q=case.q_heads,
            num_heads_kv=case.kv_heads, headdim=case.head_size, cache_seqlens=lens, qkv_dtype=DTYPE,
            cu_seqlens_q=cu, page_size=case.page, causal=True, window_size=(-1, -1), num_splits=FA3_NUM_SPLITS,
        )  # fmt: skip
        peer_out = torch.empty_like(q)

        def peer() -> torch.Tensor:
            fa3.flash_attn_varlen_func(
                q=q, k=k, v=v, out=peer_out, cu_seqlens_q=cu, max_seqlen_q=1, seqused_k=lens,
                max_seqlen_k=max_len, softmax_scale=scale, causal=True, block_table=table,
                scheduler_metadata=metadata, num_splits=FA3_NUM_SPLITS, fa_version=3,
            )  # fmt: skip
            return peer_out

        fns["peer"] = peer
    return fns, expected, ours


def mla_case_fns(
    case: RaggedCase, vllm_decode: ModuleType | None, peers: Peers
) -> tuple[dict[str, Callable[[], torch.Tensor]], torch.Tensor, Ours]:
    """Each kernel as a call returning its output, on one MLA batch, and the float64 reference."""
    gen = torch.Generator(device=DEVICE).manual_seed(6)
    table, num_pages = ragged_page_table(case.lengths, case.page, torch.Generator().manual_seed(6))
    table = table.to(DEVICE)
    lk, lv = 576, 512
    cache = torch.randn(num_pages, case.page, 1, lk, generator=gen, device=DEVICE, dtype=DTYPE)
    v_view = cache[..., :lv]
    num_seqs, max_len = len(case.lengths), max(case.lengths)
    q = torch.randn(num_seqs, case.q_heads, lk, generator=gen, device=DEVICE, dtype=DTYPE)
    lens = torch.tensor(case.lengths, dtype=torch.int32, device=DEVICE)
    scale = lk**-0.5
    expected, _ = decode_attention_reference(q, cache, v_view, table, lens, scale, case.page)
    # attn_logits as vLLM 0.24's TRITON_MLA sizes it: splits of >= 512 keys of the longest
    # sequence, a power of two, at most two per multiprocessor.
    splits = min(triton.next_power_of_2(max(1, max_len // 512)), 2 * sm_count(torch.device(DEVICE)))
    logits = torch.empty(num_seqs, case.q_heads, splits, lv + 1, device=DEVICE)
    o = torch.empty(num_seqs, case.q_heads, lv, device=DEVICE, dtype=DTYPE)
    lse = torch.empty(num_seqs, case.q_heads, device=DEVICE, dtype=DTYPE)
    one = torch.ones((), device=DEVICE)

    def ours(variant: str, config: LaunchConfig | None = None) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            decode_attention_fwd(
                q, cache, v_view, o, lse, table, lens, logits, splits, scale, case.page, 0.0, one, one, True,
                variant=variant, config=config,
            )  # fmt: skip
            return o

        return run

    fns = {"fixed": ours("fixed"), "legacy": ours("legacy")}
    if vllm_decode is not None:

        def theirs() -> torch.Tensor:
            vllm_decode.decode_attention_fwd(
                q, cache, v_view, o, lse, table, lens, logits, splits, scale, case.page,
                k_scale=one, v_scale=one, is_mla=True,
            )  # fmt: skip
            return o

        fns["vllm"] = theirs
    if peers.flashmla is not None and case.peer == "FlashMLA":
        flashmla = peers.flashmla
        # As vLLM's FLASHMLA backend: a fresh schedule object per step, filled by the first
        # call (here the warm-up before graph capture) and reused by every later one.
        metadata = flashmla.get_mla_metadata()[0]
        q_4d = q[:, None]

        def peer() -> torch.Tensor:
            out, _ = flashmla.flash_mla_with_kvcache(
                q_4d, cache, table, lens, lv, metadata, softmax_scale=scale, causal=True, is_fp8_kvcache=False
            )
            return out[:, 0]

        fns["peer"] = peer
    return fns, expected, ours


def ragged_case_row(
    case: RaggedCase, copy_bps: float, vllm: VllmTriton, peers: Peers, sweep: bool = False
) -> dict[str, Any]:
    """One row: every kernel's error against the reference (a kernel that raises or is
    wrong is left out of the timing, with the reason), then interleaved graph timings;
    with ``sweep``, our fixed kernel under other launches, timed against its default."""
    if case.kind == "gqa":
        fns, expected, ours = gqa_case_fns(case, vllm[0], peers)
    else:
        fns, expected, ours = mla_case_fns(case, vllm[1], peers)
    rel_err: dict[str, float] = {}
    notes: dict[str, str] = {}
    for kernel, fn in list(fns.items()):
        try:
            rel_err[kernel] = relative_error(fn(), expected)
            torch.cuda.synchronize()
        except Exception as exc:  # a peer's refusal or failure is reported, not fatal
            notes[f"{kernel}_error"] = repr(exc)[:200]
            del fns[kernel]
            continue
        if not rel_err[kernel] < 2e-2:
            notes[f"{kernel}_error"] = f"rel err {rel_err[kernel]:.2e} against the float64 reference: not timed"
            del fns[kernel]
    # Fewer ms of replays for big rows keeps the table near two minutes on an H200.
    rep = 25 if case.kv_bytes < 2**30 else 15
    ms = paired_ms(fns, rounds=3, rep=rep) if fns else {}
    row = ragged_row(case, ms, rel_err, copy_bps, notes)
    if sweep and "fixed" in fns:
        launches = {"default": fns["fixed"]}
        for label, config in sweep_configs(case, sm_count(torch.device(DEVICE))).items():
            err = relative_error(ours("fixed", config)(), expected)
            if err < 2e-2:
                launches[label] = ours("fixed", config)
            else:
                row[f"sweep {label}_error"] = f"rel err {err:.2e}"
        row["sweep_ms"] = paired_ms(launches, rounds=2, rep=rep)
    return row


def ragged_rows(
    copy_bps: float, vllm: VllmTriton, peers: Peers, smoke: bool, sweep: bool = False, only: list[str] | None = None
) -> Iterator[dict[str, Any]]:
    """The table's rows, one case at a time (memory is freed between cases), or those whose
    name holds a word of ``only``; a case that fails is a row with its error, and the next
    case runs."""
    for case in ragged_cases(smoke):
        if only and not any(word in case.name for word in only):
            continue
        try:
            yield ragged_case_row(case, copy_bps, vllm, peers, sweep)
        except Exception as exc:  # keep the other rows: an error is a row too
            yield {"case": case.name, "error": repr(exc)[:200]}
        torch.cuda.empty_cache()
