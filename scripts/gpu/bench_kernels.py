"""Benchmark kvcanary's attention kernels on one CUDA GPU, and reproduce the two bugs.

Everything is measured in one run, against a device-to-device copy measured in the same
run: achieved bytes/s (the fewest bytes a kernel must move: every K/V byte it reads once),
fixed/legacy time ratios, and bf16 error against a float64 reference. Beside kvcanary run,
on identical inputs, vLLM 0.24.0's own Triton kernels and the kernels vLLM runs by default
on Hopper, FlashAttention-3 (GQA) and FlashMLA (MLA), all from the folder ``--vllm-ref DIR``
(see scripts/gpu/vllm_ref.py); a kernel that does not load prints as '—' with the reason.
Times are medians of CUDA-graph replays (decode runs under CUDA graphs in vLLM) timed in
interleaved rounds; every kernel gets the launch vLLM's call site gives it. Sections: the
uniform GQA and MLA cases, the ragged-batch table (scripts/gpu/ragged_batches.py), the NaN
block tails, the int32 page offsets. The result table is printed last and written to
``--out`` (default ``$OUT`` or ``.``) as bench.txt and bench.json.

Build the reference folder where a vLLM 0.24.0 wheel (``pip download vllm==0.24.0
--no-deps``) or an unpacked ``vllm`` package is at hand, pack it (about 11 MB; the FA3
library is 153 MB raw), and unpack it in the repository on the GPU host:

    python scripts/gpu/bench_kernels.py --make-vllm-ref vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl
    python scripts/gpu/bench_kernels.py --make-vllm-ref /path/to/site-packages/vllm --vllm-ref .vllm_ref
    tar -cf - .vllm_ref | xz -6 > vllm_ref-0.24.0.tar.xz      # then, on the GPU host:
    tar -xJf vllm_ref-0.24.0.tar.xz                            # creates .vllm_ref/
    python scripts/gpu/bench_kernels.py --vllm-ref .vllm_ref --smoke   # tiny shapes, every path
    python scripts/gpu/bench_kernels.py --vllm-ref .vllm_ref [--sweep]

FA3 and FlashMLA are compiled against the torch vLLM 0.24.0 pins (2.11, CUDA 13); with
another torch they do not load and their columns print '—'.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import triton.testing

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ragged_batches import (  # noqa: E402
    LOGNORMAL_CLIP,
    LOGNORMAL_MEDIAN,
    LOGNORMAL_P99,
    RaggedCase,
    format_ragged_table,
    ragged_cases,
    ragged_page_table,
    ragged_row,
)
from vllm_ref import Peers, load_peers, load_vllm, make_vllm_ref  # noqa: E402

from kernels._launch import LaunchConfig, sm_count  # noqa: E402
from kernels.decode_attention import decode_attention_fwd  # noqa: E402
from kernels.reference import (  # noqa: E402
    decode_attention_reference,
    relative_error,
    unified_attention_reference,
)
from kernels.unified_attention import unified_attention  # noqa: E402

DEVICE = "cuda"
DTYPE = torch.bfloat16
ROWS: list[dict[str, Any]] = []


def timed_ms(fn: Callable[[], object], rep: int = 40) -> float:
    """Median of CUDA-graph replays, in ms (about ``rep`` ms of replays, 11 times)."""
    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def paired_ms(fns: Mapping[str, Callable[[], object]], rounds: int = 3, rep: int = 40) -> dict[str, float]:
    """Median times of several functions timed in interleaved rounds, so that drift in the
    card's clocks does not bias a ratio."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timed_ms(fn, rep))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def ratios(
    name: str, config: LaunchConfig | None, ms: dict[str, float], nbytes: int, copy_bps: float
) -> dict[str, Any]:
    row: dict[str, Any] = {"config": repr(config), **{f"{k}_ms": v for k, v in ms.items()}}
    for kernel, t in ms.items():
        row[f"{kernel}_tbps"] = nbytes / t * 1e-9
        row[f"{kernel}_of_copy"] = nbytes / t * 1e3 / copy_bps
    row["fixed_over_legacy"] = ms["fixed"] / ms["legacy"]
    if "vllm" in ms:
        row["ours_over_vllm"] = ms["fixed"] / ms["vllm"]
    return row


def copy_bandwidth() -> float:
    """Bytes/s of a 4 GiB device-to-device copy, counting bytes read and written."""
    src = torch.randn(2**31, device=DEVICE, dtype=DTYPE)
    dst = torch.empty_like(src)
    ms = float(triton.testing.do_bench(lambda: dst.copy_(src), rep=200, return_mode="median"))
    return 2 * 2**32 / (ms * 1e-3)


def shuffled_table(num_seqs: int, pages_per_seq: int, gen: torch.Generator, first_page: int = 0) -> torch.Tensor:
    ids = first_page + torch.randperm(num_seqs * pages_per_seq, generator=gen, device=DEVICE)
    return ids.view(num_seqs, pages_per_seq).to(torch.int32)


def record(table: str, **fields: Any) -> None:
    ROWS.append({"table": table, **fields})
    print(json.dumps(ROWS[-1]), flush=True)


# ---------------------------------------------------------------- unified attention, GQA decode
def vllm_unified_decode(
    vllm_unified: ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    cu: torch.Tensor,
    lens: torch.Tensor,
    max_len: int,
    scale: float,
    table: torch.Tensor,
) -> Callable[[], None]:
    """vLLM 0.24's unified Triton kernel called as its TRITON_ATTN backend calls it for a
    decode batch: the 3D (split) path below 128 / kv_heads sequences, 16 softmax segments,
    layer scales of 1."""
    q_heads, head = q.shape[1:]
    kv_heads = k.shape[2]
    segments, threshold = 16, 128 // kv_heads
    segm_out = torch.empty(threshold, q_heads, segments, head, device=DEVICE)
    segm_max = torch.empty(threshold, q_heads, segments, device=DEVICE)
    segm_sum = torch.empty_like(segm_max)
    ones = torch.ones(lens.shape[0], kv_heads, device=DEVICE)
    return lambda: vllm_unified.unified_attention(
        q=q, k=k, v=v, out=out, cu_seqlens_q=cu, max_seqlen_q=1, seqused_k=lens, max_seqlen_k=max_len,
        softmax_scale=scale, causal=True, window_size=(-1, -1), block_table=table, softcap=0.0,
        q_descale=None, k_descale=ones, v_descale=ones, seq_threshold_3D=threshold,
        num_par_softmax_segments=segments, softmax_segm_output=segm_out, softmax_segm_max=segm_max,
        softmax_segm_expsum=segm_sum,
    )  # fmt: skip


def bench_gqa(
    copy_bps: float, vllm_unified: ModuleType | None, sweep: bool, num_seqs: int = 64, seq_len: int = 8192
) -> None:
    """Unified attention, GQA decode: 32 query / 8 KV heads of 128, 16-token blocks, bf16."""
    q_heads, kv_heads, head, block = 32, 8, 128, 16
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    pages = seq_len // block
    kv = torch.randn(num_seqs * pages, 2, block, kv_heads, head, generator=gen, device=DEVICE, dtype=DTYPE)
    k, v = kv.unbind(1)
    table = shuffled_table(num_seqs, pages, gen)
    q = torch.randn(num_seqs, q_heads, head, generator=gen, device=DEVICE, dtype=DTYPE)
    cu = torch.arange(num_seqs + 1, dtype=torch.int32, device=DEVICE)
    lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=DEVICE)
    scale = head**-0.5
    expected = unified_attention_reference(q, k, v, cu, lens, table, scale, True)
    nbytes = 2 * num_seqs * seq_len * kv_heads * head * 2
    out = torch.empty_like(q)

    def ours(variant: str, config: LaunchConfig | None) -> Callable[[], None]:
        return lambda: unified_attention(
            q, k, v, out, cu, 1, lens, seq_len, scale, True, (-1, -1), table, 0.0, None, None, None,
            variant=variant, config=config,
        )  # fmt: skip

    configs: list[LaunchConfig | None] = [None]
    if sweep:
        configs += [LaunchConfig(num_stages=4), LaunchConfig(num_splits=2)]
    best: tuple[float, LaunchConfig | None] | None = None
    for config in configs:
        ms = timed_ms(ours("fixed", config))
        err = relative_error(out, expected)
        record("gqa_sweep", config=repr(config), ms=ms, tbps=nbytes / ms * 1e-9, rel_err=err)
        if err < 1e-2 and (best is None or ms < best[0]):
            best = (ms, config)
    assert best is not None, "no GQA configuration matched the reference"
    config = best[1]
    fns = {"fixed": ours("fixed", config), "legacy": ours("legacy", config)}
    if vllm_unified is not None:
        fns["vllm"] = vllm_unified_decode(vllm_unified, q, k, v, out, cu, lens, seq_len, scale, table)
    row = ratios("gqa", config, paired_ms(fns), nbytes, copy_bps)
    for kernel, fn in fns.items():
        fn()
        row[f"{kernel}_rel_err"] = relative_error(out, expected)
    record("gqa", **row)


# ---------------------------------------------------------------- MLA decode
def bench_mla(copy_bps: float, vllm_decode: ModuleType | None, num_seqs: int, seq_len: int, sweep: bool) -> None:
    heads, lk, lv, page = 16, 576, 512, 64
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    pages = seq_len // page
    cache = torch.randn(num_seqs * pages, page, 1, lk, generator=gen, device=DEVICE, dtype=DTYPE)
    v_view = cache[..., :lv]
    table = shuffled_table(num_seqs, pages, gen)
    q = torch.randn(num_seqs, heads, lk, generator=gen, device=DEVICE, dtype=DTYPE)
    lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=DEVICE)
    scale = lk**-0.5
    splits = min(triton.next_power_of_2(max(1, seq_len // 512)), 2 * sm_count(torch.device(DEVICE)))
    logits = torch.empty(num_seqs, heads, splits, lv + 1, device=DEVICE)
    o = torch.empty(num_seqs, heads, lv, device=DEVICE, dtype=DTYPE)
    lse = torch.empty(num_seqs, heads, device=DEVICE, dtype=DTYPE)
    one = torch.ones((), device=DEVICE)
    exp_o, _ = decode_attention_reference(q, cache, v_view, table, lens, scale, page)
    nbytes = num_seqs * seq_len * lk * 2
    name = f"mla_{num_seqs}x{seq_len // 1024}k"

    def ours(variant: str, config: LaunchConfig | None) -> Callable[[], None]:
        return lambda: decode_attention_fwd(
            q, cache, v_view, o, lse, table, lens, logits, splits, scale, page, 0.0, one, one, True,
            variant=variant, config=config,
        )  # fmt: skip

    configs: list[LaunchConfig | None] = [None]
    if sweep:
        configs += [LaunchConfig(tile=64, num_stages=2), LaunchConfig(num_splits=4 * sm_count(q.device) // num_seqs)]
    best: tuple[float, LaunchConfig | None] | None = None
    for config in configs:
        ms = timed_ms(ours("fixed", config))
        err = relative_error(o, exp_o)
        record(f"{name}_sweep", config=repr(config), ms=ms, tbps=nbytes / ms * 1e-9, rel_err=err)
        if err < 1e-2 and (best is None or ms < best[0]):
            best = (ms, config)
    assert best is not None, f"no {name} configuration matched the reference"
    config = best[1]
    fns = {"fixed": ours("fixed", config), "legacy": ours("legacy", config)}
    if vllm_decode is not None:

        def theirs() -> None:
            vllm_decode.decode_attention_fwd(
                q, cache, v_view, o, lse, table, lens, logits, splits, scale, page,
                k_scale=one, v_scale=one, is_mla=True,
            )  # fmt: skip

        fns["vllm"] = theirs
    row = ratios(name, config, paired_ms(fns), nbytes, copy_bps)
    row["splits_given"] = splits
    for kernel, fn in fns.items():
        fn()
        row[f"{kernel}_rel_err"] = relative_error(o, exp_o)
    record(name, **row)


# ---------------------------------------------------------------- ragged batches against FA3 and FlashMLA
FA3_NUM_SPLITS = 32  # vLLM 0.24's flash_attn_max_num_splits_for_cuda_graph: what decode under graphs gets


def gqa_case_fns(
    case: RaggedCase, vllm_unified: ModuleType | None, peers: Peers
) -> tuple[dict[str, Callable[[], torch.Tensor]], torch.Tensor]:
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

    def ours(variant: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            unified_attention(
                q, k, v, out, cu, 1, lens, max_len, scale, True, (-1, -1), table, 0.0, None, None, None,
                variant=variant,
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
    return fns, expected


def mla_case_fns(
    case: RaggedCase, vllm_decode: ModuleType | None, peers: Peers
) -> tuple[dict[str, Callable[[], torch.Tensor]], torch.Tensor]:
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

    def ours(variant: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            decode_attention_fwd(
                q, cache, v_view, o, lse, table, lens, logits, splits, scale, case.page, 0.0, one, one, True,
                variant=variant,
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
    return fns, expected


VllmTriton = tuple[ModuleType | None, ModuleType | None]  # vLLM's unified and decode modules


def bench_ragged_case(case: RaggedCase, copy_bps: float, vllm: VllmTriton, peers: Peers) -> None:
    """One row: every kernel's error against the reference (a kernel that raises or is
    wrong is left out of the timing, with the reason), then interleaved graph timings."""
    if case.kind == "gqa":
        fns, expected = gqa_case_fns(case, vllm[0], peers)
    else:
        fns, expected = mla_case_fns(case, vllm[1], peers)
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
    ms = paired_ms(fns, rounds=3, rep=25 if case.kv_bytes < 2**30 else 15) if fns else {}
    record("ragged", **ragged_row(case, ms, rel_err, copy_bps, notes))


def bench_ragged(copy_bps: float, vllm: VllmTriton, peers: Peers, smoke: bool) -> None:
    for case in ragged_cases(smoke):
        try:
            bench_ragged_case(case, copy_bps, vllm, peers)
        except Exception as exc:  # keep the other rows: an error is a row too
            record("ragged", case=case.name, error=repr(exc)[:200])
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- bug 1: NaN block tails
def nan_tail(vllm_unified: ModuleType | None, num_seqs: int = 16, seq_len: int = 1500) -> None:
    """Whisper-like cross-attention: 16 sequences of 1500 encoder keys, 20 heads of 64,
    16-token blocks, the unwritten tail of each last block and the next block all NaN."""
    heads, head, block = 20, 64, 16
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    pages = -(-seq_len // block) + 1
    kv = torch.randn(num_seqs * pages, 2, block, heads, head, generator=gen, device=DEVICE, dtype=DTYPE)
    table = shuffled_table(num_seqs, pages, gen)
    for row in table.tolist():
        kv[row[-2], :, seq_len % block :] = float("nan")
        kv[row[-1]] = float("nan")
    k, v = kv.unbind(1)
    q = torch.randn(num_seqs, heads, head, generator=gen, device=DEVICE, dtype=DTYPE)
    cu = torch.arange(num_seqs + 1, dtype=torch.int32, device=DEVICE)
    lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=DEVICE)
    kernels = ["fixed", "legacy"] + (["vllm_0.24"] if vllm_unified is not None else [])
    for causal in (False, True):
        expected = unified_attention_reference(q, k, v, cu, lens, table, head**-0.5, causal)
        result: dict[str, Any] = {"causal": causal}
        for name in kernels:
            out = torch.full_like(q, float("nan"))
            if name == "vllm_0.24":
                assert vllm_unified is not None
                vllm_unified.unified_attention(
                    q=q, k=k, v=v, out=out, cu_seqlens_q=cu, max_seqlen_q=1, seqused_k=lens, max_seqlen_k=seq_len,
                    softmax_scale=head**-0.5, causal=causal, window_size=(-1, -1), block_table=table, softcap=0.0,
                    q_descale=None, k_descale=None, v_descale=None,
                )  # fmt: skip
            else:
                unified_attention(
                    q, k, v, out, cu, 1, lens, seq_len, head**-0.5, causal, (-1, -1), table, 0.0, None, None, None,
                    variant=name,
                )  # fmt: skip
            bad = int((~torch.isfinite(out.view(num_seqs, -1)).all(dim=1)).sum())
            result[name] = f"{bad}/{num_seqs} non-finite, rel err {relative_error(out, expected):.2e}"
        record("nan_tail", **result)


# ---------------------------------------------------------------- bug 2: int32 page offsets
KIMI_PAGE, KIMI_WIDTH, KIMI_FIRST_WRAP = 480, 576, 7768


def kimi_case(which: str, first_page: int, ref_dir: str | None, num_seqs: int = 8, seq_len: int = 4800) -> str:
    """MLA decode over Kimi's 276,480-element pages from ``first_page`` on: its relative
    error. An illegal address may surface here or at the next synchronisation."""
    heads = 16
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    pages = seq_len // KIMI_PAGE
    cache = torch.empty(first_page + num_seqs * pages, KIMI_PAGE, 1, KIMI_WIDTH, device=DEVICE, dtype=DTYPE)
    cache[first_page:] = torch.randn(*cache[first_page:].shape, generator=gen, device=DEVICE, dtype=DTYPE)
    table = shuffled_table(num_seqs, pages, gen, first_page)
    q = torch.randn(num_seqs, heads, KIMI_WIDTH, generator=gen, device=DEVICE, dtype=DTYPE)
    lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=DEVICE)
    o = torch.empty(num_seqs, heads, 512, device=DEVICE, dtype=DTYPE)
    lse = torch.empty(num_seqs, heads, device=DEVICE)
    logits = torch.empty(num_seqs, heads, 8, 513, device=DEVICE)
    one = torch.ones((), device=DEVICE)
    args = (q, cache, cache[..., :512], o, lse, table, lens, logits, 8, KIMI_WIDTH**-0.5, KIMI_PAGE)
    if which == "vllm_0.24":
        _, vllm_decode, _ = load_vllm(ref_dir)
        assert vllm_decode is not None
        vllm_decode.decode_attention_fwd(*args, k_scale=one, v_scale=one, is_mla=True)
    else:
        decode_attention_fwd(*args, 0.0, one, one, True, variant=which)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    expected, _ = decode_attention_reference(q, cache, cache[..., :512], table, lens, KIMI_WIDTH**-0.5, KIMI_PAGE)
    return f"rel err {relative_error(o, expected):.2e}"


def int32_pages(with_vllm: bool, ref_dir: str | None) -> None:
    """Below page 7,768 every kernel is right; from it on the int32 ones fault, which ends a
    CUDA context: those runs go to a child process."""
    below = KIMI_FIRST_WRAP - 300
    for which in ["fixed", "legacy"] + (["vllm_0.24"] if with_vllm else []):
        result = {f"pages_from_{below}": kimi_case(which, below, ref_dir)}
        if which == "fixed":
            result[f"pages_from_{KIMI_FIRST_WRAP}"] = kimi_case(which, KIMI_FIRST_WRAP, ref_dir)
        else:
            done = subprocess.run(
                [sys.executable, __file__, "--probe", which, str(KIMI_FIRST_WRAP), "--vllm-ref", str(ref_dir)],
                capture_output=True, text=True, timeout=300, cwd=REPO,
            )  # fmt: skip
            lines = [ln for ln in (done.stdout + done.stderr).splitlines() if "PROBE" in ln or "rror" in ln]
            result[f"pages_from_{KIMI_FIRST_WRAP}"] = f"rc={done.returncode}: " + (lines[-1][:100] if lines else "?")
        record("int32_pages", kernel=which, **result)


def summary(copy_bps: float, vllm_note: str, peers: Peers) -> str:
    lines = [f"device-to-device copy: {copy_bps * 1e-12:.2f} TB/s (4 GiB, read+write); vLLM: {vllm_note}"]
    uniform = [
        r for r in ROWS if r["table"] == "gqa" or (r["table"].startswith("mla_") and not r["table"].endswith("_sweep"))
    ]
    if uniform:
        lines.append(
            f"{'case':<12}{'ms':>8}{'TB/s':>7}{'%copy':>7}{'fix/leg':>9}{'ours/vLLM':>10}{'vLLM%copy':>10}{'relerr':>9}"
        )
    for r in uniform:
        lines.append(
            f"{r['table']:<12}{r['fixed_ms']:>8.3f}{r['fixed_tbps']:>7.2f}{100 * r['fixed_of_copy']:>6.1f}%"
            f"{r['fixed_over_legacy']:>9.3f}{r.get('ours_over_vllm', float('nan')):>10.3f}"
            f"{100 * r.get('vllm_of_copy', float('nan')):>9.1f}%{r['fixed_rel_err']:>9.1e}   {r['config']}"
        )
    for r in ROWS:
        if r["table"] in ("nan_tail", "int32_pages"):
            lines.append(" ".join(f"{k}={v}" for k, v in r.items() if k != "table"))
    ragged = [r for r in ROWS if r["table"] == "ragged"]
    if ragged:
        lines.append(
            f"ragged decode batches, bf16, default launches: lengths lognormal (median {LOGNORMAL_MEDIAN}, "
            f"p99 {LOGNORMAL_P99}, clipped to {list(LOGNORMAL_CLIP)}, seed = batch size) or uniform in a range; "
            "%copy = every K/V byte read once at the copy bandwidth; peer: FA3 (GQA) or FlashMLA (MLA, page 64)"
        )
        lines.append(f"peers: {peers.fa3_note}; {peers.flashmla_note}")
        lines.append(format_ragged_table(ragged))
        for r in ragged:
            lines += [f"  {r['case']}: {k}={v}" for k, v in r.items() if k.endswith("_error")]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-ref", default=None, help="folder with vLLM 0.24's Triton attention sources")
    parser.add_argument("--sweep", action="store_true", help="also time a few launch configurations")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for bench.json and bench.txt")
    parser.add_argument(
        "--make-vllm-ref",
        metavar="WHEEL_OR_DIR",
        help="build --vllm-ref's folder from a vLLM 0.24.0 wheel or unpacked vllm package folder, then exit",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny ragged batches (every kernel and peer) and the NaN tails only"
    )
    parser.add_argument("--probe", nargs=2, metavar=("KERNEL", "FIRST_PAGE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_vllm_ref:
        missing = make_vllm_ref(args.make_vllm_ref, args.vllm_ref or ".vllm_ref")
        if missing:
            print(f"not in {args.make_vllm_ref} (their peers will be missing): {', '.join(missing)}")
        return
    if args.probe:
        print("PROBE", kimi_case(args.probe[0], int(args.probe[1]), args.vllm_ref), flush=True)
        return
    started = time.time()
    vllm_unified, vllm_decode, vllm_note = load_vllm(args.vllm_ref)
    peers = load_peers(args.vllm_ref)
    copy_bps = copy_bandwidth()
    record("copy", tbps=copy_bps * 1e-12)
    if not args.smoke:
        bench_gqa(copy_bps, vllm_unified, args.sweep)
        bench_mla(copy_bps, vllm_decode, 32, 8192, args.sweep)
        bench_mla(copy_bps, vllm_decode, 64, 32768, args.sweep)
        torch.cuda.empty_cache()
    bench_ragged(copy_bps, (vllm_unified, vllm_decode), peers, args.smoke)
    nan_tail(vllm_unified)
    if not args.smoke:
        int32_pages(vllm_decode is not None, args.vllm_ref)
    text = summary(copy_bps, vllm_note, peers) + f"\n({time.time() - started:.0f} s, {torch.cuda.get_device_name()})"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(ROWS, indent=1))
    (out / "bench.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
