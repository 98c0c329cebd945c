"""Benchmark kvcanary's attention kernels on one CUDA GPU, and reproduce the two bugs.

Everything is measured in one run, against a device-to-device copy measured in the same
run: achieved bytes/s (the fewest bytes a kernel must move: every K/V byte it reads once),
fixed/legacy time ratios, and bf16 error against a float64 reference. Beside kvcanary run,
on identical inputs, vLLM 0.24.0's own Triton kernels and the kernels vLLM runs by default
on Hopper, FlashAttention-3 (GQA) and FlashMLA (MLA), all from the folder ``--vllm-ref DIR``
(see scripts/gpu/vllm_ref.py); a kernel that does not load prints as '—' with the reason.
Times are medians of CUDA-graph replays (decode runs under CUDA graphs in vLLM) timed in
interleaved rounds; every kernel gets the launch vLLM's call site gives it. Sections: the
uniform GQA and MLA cases, the ragged-batch table (scripts/gpu/bench_ragged.py), the NaN
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
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import triton.testing

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench_ragged import ragged_rows  # noqa: E402
from cuda_timing import DEVICE, DTYPE, paired_ms, timed_ms  # noqa: E402
from ragged_batches import LOGNORMAL_CLIP, LOGNORMAL_MEDIAN, LOGNORMAL_P99, format_ragged_table, format_sweep  # noqa: E402
from vllm_ref import Peers, load_peers, load_vllm, make_vllm_ref, vllm_unified_decode  # noqa: E402

from kernels._launch import LaunchConfig, sm_count  # noqa: E402
from kernels.decode_attention import decode_attention_fwd  # noqa: E402
from kernels.reference import (  # noqa: E402
    decode_attention_reference,
    relative_error,
    unified_attention_reference,
)
from kernels.unified_attention import unified_attention  # noqa: E402

ROWS: list[dict[str, Any]] = []


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
        configs += [LaunchConfig(num_stages=4), LaunchConfig(num_splits=1)]
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
        configs += [LaunchConfig(tile=32), LaunchConfig(num_splits=4 * sm_count(q.device))]
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
                [sys.executable, __file__, "--probe", which, str(KIMI_FIRST_WRAP)]
                + (["--vllm-ref", str(Path(ref_dir).resolve())] if ref_dir else []),
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
        swept = [format_sweep(r) for r in ragged if r.get("sweep_ms")]
        if swept:
            lines.append("launches swept (our fixed kernel, ms; ratio to the default launch):")
            lines += swept
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-ref", default=None, help="folder with vLLM 0.24's Triton attention sources")
    parser.add_argument("--sweep", action="store_true", help="also time a few launch configurations (ragged rows too)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for bench.json and bench.txt")
    parser.add_argument(
        "--make-vllm-ref",
        metavar="WHEEL_OR_DIR",
        help="build --vllm-ref's folder from a vLLM 0.24.0 wheel or unpacked vllm package folder, then exit",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny ragged batches (every kernel and peer) and the NaN tails only"
    )
    parser.add_argument(
        "--cases", default=None, help="only the ragged rows whose name holds one of these comma-separated words"
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
    whole = not args.smoke and not args.cases
    if whole:
        bench_gqa(copy_bps, vllm_unified, args.sweep)
        bench_mla(copy_bps, vllm_decode, 32, 8192, args.sweep)
        bench_mla(copy_bps, vllm_decode, 64, 32768, args.sweep)
        torch.cuda.empty_cache()
    only = args.cases.split(",") if args.cases else None
    for row in ragged_rows(copy_bps, (vllm_unified, vllm_decode), peers, args.smoke, args.sweep, only):
        record("ragged", **row)
    if whole or args.smoke:
        nan_tail(vllm_unified)
    if whole:
        int32_pages(vllm_decode is not None, args.vllm_ref)
    text = summary(copy_bps, vllm_note, peers) + f"\n({time.time() - started:.0f} s, {torch.cuda.get_device_name()})"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(ROWS, indent=1))
    (out / "bench.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
