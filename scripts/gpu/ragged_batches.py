"""The ragged-batch decode cases of the kernel benchmark, their byte and FLOP counts, and
the table that reports them. Nothing here needs a GPU.

Length mixes: a serving batch's context lengths are long-tailed, so most cases draw them
from a lognormal with median 2,048 and 99th percentile 32,768 tokens, clipped to
[16, 65,536] and seeded by the batch size (the same lengths on every host). The issue's
fixed cases draw uniformly from a range, or are uniform.
"""

import math
import random
from dataclasses import dataclass
from typing import Any

import torch

from kernels._launch import Launch, LaunchConfig
from kernels.decode_attention import _MAX_HEADS_PER_PROGRAM as MAX_HEADS_PER_PROGRAM
from kernels.decode_attention import _default_launch as decode_launch
from kernels.unified_attention import _default_launch as unified_launch

LOGNORMAL_MEDIAN, LOGNORMAL_P99, LOGNORMAL_CLIP = 2048, 32768, (16, 65536)
_Z99 = 2.3263478740408408  # the standard normal's 99th percentile
BF16_BYTES = 2
MLA_LK, MLA_LV = 576, 512
MISSING = "—"


def lognormal_lengths(
    num_seqs: int,
    seed: int,
    median: int = LOGNORMAL_MEDIAN,
    p99: int = LOGNORMAL_P99,
    clip: tuple[int, int] = LOGNORMAL_CLIP,
) -> tuple[int, ...]:
    """``num_seqs`` lengths from a lognormal with the given median and 99th percentile,
    rounded and clipped to ``clip``."""
    sigma = math.log(p99 / median) / _Z99
    rng = random.Random(seed)
    return tuple(
        min(clip[1], max(clip[0], round(rng.lognormvariate(math.log(median), sigma)))) for _ in range(num_seqs)
    )


def range_lengths(num_seqs: int, seed: int, low: int, high: int) -> tuple[int, ...]:
    """``num_seqs`` lengths drawn uniformly from ``[low, high]``."""
    rng = random.Random(seed)
    return tuple(rng.randint(low, high) for _ in range(num_seqs))


@dataclass(frozen=True)
class RaggedCase:
    """One decode batch: one query per sequence over ``lengths`` keys. GQA cases run the
    unified kernel (and FA3), MLA cases the decode kernel (and FlashMLA, page 64 only);
    an MLA cache row is 576 wide, its first 512 columns the values."""

    name: str
    kind: str  # "gqa" or "mla"
    lengths: tuple[int, ...]
    q_heads: int
    kv_heads: int = 1
    head_size: int = 128
    page: int = 16
    report_flops: bool = False

    @property
    def peer(self) -> str | None:
        """The kernel vLLM runs by default on Hopper for this case, if it can run it."""
        if self.kind == "gqa":
            return "FA3"
        return "FlashMLA" if self.page == 64 else None

    @property
    def kv_bytes(self) -> int:
        """Every K/V byte the batch must read once (MLA: one 576-wide row per key)."""
        if self.kind == "mla":
            return sum(self.lengths) * MLA_LK * BF16_BYTES
        return 2 * sum(self.lengths) * self.kv_heads * self.head_size * BF16_BYTES

    @property
    def flops(self) -> int:
        """Multiply-adds times two of QK^T and PV over every key and query head."""
        qk, pv = (MLA_LK, MLA_LV) if self.kind == "mla" else (self.head_size, self.head_size)
        return 2 * sum(self.lengths) * self.q_heads * (qk + pv)


def _lengths_note(lengths: tuple[int, ...]) -> str:
    return f"{len(lengths)} seqs {min(lengths)}-{max(lengths)}"


def ragged_cases(smoke: bool = False) -> list[RaggedCase]:
    """The table's cases; ``smoke``: a few tiny batches that take every path (each peer,
    page 480, the many-head MLA row) in seconds."""
    if smoke:
        return [
            RaggedCase("gqa smoke 32q/8kv", "gqa", range_lengths(5, 1, 16, 700), 32, 8),
            RaggedCase("gqa smoke 64q/8kv", "gqa", range_lengths(3, 2, 16, 700), 64, 8),
            RaggedCase("mla smoke 16h p64", "mla", range_lengths(5, 3, 16, 900), 16, page=64),
            RaggedCase("mla smoke 128h p64", "mla", range_lengths(3, 4, 16, 900), 128, page=64, report_flops=True),
            RaggedCase("mla smoke 8h p480", "mla", range_lengths(3, 5, 16, 1500), 8, page=480),
        ]
    cases = [
        RaggedCase(f"gqa lognormal x{n} 32q/8kv", "gqa", lognormal_lengths(n, seed=n), 32, 8) for n in (8, 16, 64, 256)
    ]
    cases += [
        RaggedCase("gqa 64x8k uniform 32q/8kv", "gqa", (8192,) * 64, 32, 8),
        RaggedCase("gqa 16x1.5k uniform 32q/8kv", "gqa", (1536,) * 16, 32, 8),
        RaggedCase("gqa 48 ragged 1k-16k 64q/8kv", "gqa", range_lengths(48, 48, 1024, 16384), 64, 8),
        RaggedCase("gqa 256 ragged 0.25k-4k 32q/8kv", "gqa", range_lengths(256, 256, 256, 4096), 32, 8),
    ]
    cases += [
        RaggedCase(f"mla lognormal x{n} 16h p64", "mla", lognormal_lengths(n, seed=n), 16, page=64)
        for n in (32, 64, 128)
    ]
    cases += [
        RaggedCase("mla 128x4k uniform 16h p64", "mla", (4096,) * 128, 16, page=64),
        RaggedCase("mla 64 ragged 2k-16k 16h p64", "mla", range_lengths(64, 64, 2048, 16384), 16, page=64),
        RaggedCase(
            "mla 32 ragged 1k-8k 128h p64", "mla", range_lengths(32, 32, 1024, 8192), 128, page=64, report_flops=True
        ),
        RaggedCase("mla 64 ragged 2k-16k 8h p480", "mla", range_lengths(64, 65, 2048, 16384), 8, page=480),
    ]
    return cases


def default_launch(case: RaggedCase, num_sms: int) -> Launch:
    """The kernel's default launch for this case."""
    if case.kind == "gqa":
        return unified_launch(True, case.kv_heads, max(case.lengths), num_sms)
    heads_per_program = min(case.q_heads, MAX_HEADS_PER_PROGRAM)
    return decode_launch(True, heads_per_program, 1, case.q_heads, num_sms, case.page)


def sweep_configs(case: RaggedCase, num_sms: int) -> dict[str, LaunchConfig]:
    """Launches to time beside the default with ``--sweep``: half, one and a half and twice
    the default's work items (``num_splits`` counts items per head group; an explicit count
    also lifts the pieces' minimum length), the other tile, warp count and pipeline depth
    (each alone, and tile with depth), no split at all for GQA, 32-head groups for many-head
    MLA, and on MLA pages the tiles divide the other way of loading them (TMA copies or
    pointer loads). Labels name what changed."""
    default = default_launch(case, num_sms)
    items = default.num_splits
    many_head = case.kind == "mla" and case.q_heads >= 64
    configs = {
        "items/2": LaunchConfig(num_splits=max(1, items // 2)),
        "items*1.5": LaunchConfig(num_splits=items * 3 // 2),
        "items*2": LaunchConfig(num_splits=2 * items),
    }
    if case.kind == "gqa":
        configs["no split"] = LaunchConfig(num_splits=1)
    elif many_head:
        configs["heads 32"] = LaunchConfig(heads_per_program=32)
    other_tile = 32 if default.tile == 64 else 64
    configs[f"tile {other_tile}"] = LaunchConfig(tile=other_tile)
    # 8 warps are the fewest that hold a 64-head group's accumulator (4 spill 1.9 KB).
    other_warps = 16 if many_head else (8 if default.num_warps == 4 else 4)
    configs[f"warps {other_warps}"] = LaunchConfig(num_warps=other_warps)
    other_stages = 3 if default.num_stages == 2 else 2
    configs[f"stages {other_stages}"] = LaunchConfig(num_stages=other_stages)
    configs[f"tile {other_tile} stages {other_stages}"] = LaunchConfig(tile=other_tile, num_stages=other_stages)
    if case.kind == "mla" and case.page % default.tile == 0:
        configs["pointer loads" if default.row_tma else "tma"] = LaunchConfig(row_tma=not default.row_tma)
    return configs


def format_sweep(row: dict[str, Any]) -> str:
    """One line per swept row: each launch's time and its ratio to the default's."""
    sweep: dict[str, float] = row.get("sweep_ms") or {}
    if not sweep:
        return ""
    default = sweep["default"]
    parts = [f"{label} {ms:.3f} ms ({ms / default:.2f}x)" for label, ms in sweep.items() if label != "default"]
    return f"  {row['case']}: default {default:.3f} ms; " + "; ".join(parts)


TABLE_SLACK = 8  # spare columns: kernels that read the table a tile past a sequence stay inside it


def ragged_page_table(lengths: tuple[int, ...], page: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """An int32 block table giving each sequence its own pages in a shuffled order, and
    the number of pages. Rows are padded with page 0 to ``TABLE_SLACK`` columns past the
    longest sequence, as vLLM's table (sized for the longest context) is padded."""
    counts = [-(-n // page) for n in lengths]
    ids = torch.randperm(sum(counts), generator=gen)
    table = torch.zeros(len(lengths), max(counts) + TABLE_SLACK, dtype=torch.int32)
    start = 0
    for row, count in enumerate(counts):
        table[row, :count] = ids[start : start + count]
        start += count
    return table, start


def ragged_row(
    case: RaggedCase, ms: dict[str, float], rel_err: dict[str, float], copy_bps: float, notes: dict[str, str]
) -> dict[str, Any]:
    """A table row from the medians ``ms`` of the kernels that ran (``fixed``, ``legacy``,
    ``vllm``, ``peer``) and their errors against the float64 reference."""
    row: dict[str, Any] = {
        "case": case.name,
        "lengths": _lengths_note(case.lengths),
        "kv_bytes": case.kv_bytes,
        "peer": case.peer,
        **{f"{k}_ms": v for k, v in ms.items()},
        **{f"{k}_rel_err": v for k, v in rel_err.items()},
        **notes,
    }
    for kernel, t in ms.items():
        row[f"{kernel}_of_copy"] = case.kv_bytes / (t * 1e-3) / copy_bps
        if case.report_flops:
            row[f"{kernel}_tflops"] = case.flops / (t * 1e-3) * 1e-12
    if "fixed" in ms and "legacy" in ms:
        row["fixed_over_legacy"] = ms["fixed"] / ms["legacy"]
    for other in ("vllm", "peer"):
        if "fixed" in ms and other in ms:
            row[f"ours_over_{other}"] = ms["fixed"] / ms[other]
    return row


def _cell(row: dict[str, Any], key: str, fmt: str, scale: float = 1.0) -> str:
    value = row.get(key)
    return MISSING if value is None else format(value * scale, fmt)


_COLUMNS = (
    # header, key, format, scale, width
    ("case", "case", "", 1.0, 33),
    ("K/V MB", "kv_bytes", ".0f", 1e-6, 8),
    ("ms", "fixed_ms", ".3f", 1.0, 8),
    ("%copy", "fixed_of_copy", ".1f", 100.0, 7),
    ("fix/leg", "fixed_over_legacy", ".3f", 1.0, 8),
    ("vLLM%", "vllm_of_copy", ".1f", 100.0, 7),
    ("ours/vLLM", "ours_over_vllm", ".3f", 1.0, 10),
    ("peer", "peer", "", 1.0, 9),
    ("peer%", "peer_of_copy", ".1f", 100.0, 7),
    ("ours/peer", "ours_over_peer", ".3f", 1.0, 10),
    ("TFLOP/s", "fixed_tflops", ".0f", 1.0, 8),
    ("vLLM TF", "vllm_tflops", ".0f", 1.0, 8),
    ("peer TF", "peer_tflops", ".0f", 1.0, 8),
    ("err ours", "fixed_rel_err", ".1e", 1.0, 9),
    ("err vLLM", "vllm_rel_err", ".1e", 1.0, 9),
    ("err peer", "peer_rel_err", ".1e", 1.0, 9),
)


def format_ragged_table(rows: list[dict[str, Any]]) -> str:
    """The rows as fixed-width text; a value a row lacks (no peer, a peer that failed, no
    FLOP rate asked for) prints as '—'. %copy: bytes at the measured copy bandwidth."""
    lines = ["".join(h.ljust(w) if k == "case" else h.rjust(w) for h, k, _, _, w in _COLUMNS) + "  lengths"]
    for row in rows:
        cells = []
        for _, key, fmt, scale, width in _COLUMNS:
            text = str(row.get(key) or MISSING) if fmt == "" else _cell(row, key, fmt, scale)
            cells.append(text.ljust(width) if key == "case" else text.rjust(width))
        line = "".join(cells) + f"  {row.get('lengths', '')}"
        if row.get("error"):
            line += f"  error: {row['error']}"
        lines.append(line)
    return "\n".join(lines)
