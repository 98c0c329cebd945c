# mypy: disable-error-code="no-untyped-def"
# Triton reads a kernel parameter's annotation as its type, so the kernel leaves them off.
"""Token-balanced split-KV: the work schedule and the merge, shared by both kernels.

A split-KV launch has a fixed grid of work items (fixed on the host from the batch size,
heads and multiprocessors, so that a CUDA graph can replay it). Every program derives the
schedule on the device from the sequences' key tiles (from ``seq_lens``, never read on the
host): the smallest piece length ``L`` (in tiles) for which cutting each sequence into
``ceil(tiles / L)`` pieces (equal to within a tile) needs at most the grid's items, so the longest piece, and
with it the wave, is as short as the grid allows. Item ``i`` is one piece of one sequence;
items past the pieces' count exit.

Each item writes the piece's normalised output and log-sum-exp into
``partials[item, head, :head_size]`` and ``partials[item, head, head_size]``; a piece that saw
no key writes ``lse = -inf``. The merge combines a sequence's items, which are consecutive:
``sched[seq] = (first item, number of items)``, written by the first program.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def piece_floor(work, min_tiles, fill_items):
    """The pieces' shortest length: ``min_tiles``, lowered to ``ceil(tiles / fill_items)``
    where the batch's ``tiles`` (the sum of ``work``) are fewer than ``fill_items`` times
    ``min_tiles``, so that a short batch still makes about ``fill_items`` pieces."""
    return tl.minimum(min_tiles, tl.maximum(tl.cdiv(tl.sum(work), fill_items), 1))


@triton.jit
def balanced_piece(work, seqs, num_seqs, item, num_items, min_tiles, sched_ptr, write_sched):
    """(sequence, first tile, tiles) of work item ``item``; the sequence is ``>= num_seqs``
    for an item past the pieces. ``work[seqs]`` holds each sequence's tiles (0 past
    ``num_seqs``; ``seqs`` is ``tl.arange`` over a power of two).

    Pieces are at least ``min_tiles`` long (fewer partials for short batches); where
    ``write_sched`` (one program) the sequences' item ranges go to ``sched_ptr`` for the merge.
    """
    total = tl.sum(work)
    lo = tl.maximum(tl.maximum(tl.cdiv(total, num_items), min_tiles), 1)
    hi = tl.maximum(tl.max(work), lo)
    # Bisection for the smallest piece length whose piece count fits the grid. It fits at
    # the longest sequence's length (one piece each; num_items >= num_seqs) and, where the
    # grid has more items than sequences with keys, at total / (items - those sequences)
    # (each sequence rounds up by less than one piece): a range of a few lengths.
    spare = num_items - tl.sum((work > 0).to(tl.int32))
    if spare > 0:
        hi = tl.maximum(tl.minimum(hi, tl.cdiv(total, spare)), lo)
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.sum(tl.cdiv(work, mid)) <= num_items:
            hi = mid
        else:
            lo = mid + 1
    counts = tl.cdiv(work, lo)
    ends = tl.cumsum(counts, 0)
    written = seqs < tl.where(write_sched, num_seqs, 0)
    tl.store(sched_ptr + 2 * seqs, ends - counts, mask=written)
    tl.store(sched_ptr + 2 * seqs + 1, counts, mask=written)
    seq = tl.sum((ends <= item).to(tl.int32))
    mine = seqs == seq
    first_item = tl.sum(tl.where(mine, ends - counts, 0))
    count = tl.maximum(tl.sum(tl.where(mine, counts, 0)), 1)
    tiles = tl.sum(tl.where(mine, work, 0))
    # Pieces of one sequence differ by at most a tile: the first ``tiles % count`` are longer.
    index = item - first_item
    base = tiles // count
    longer = tiles % count
    return seq, index * base + tl.minimum(index, longer), base + (index < longer).to(tl.int32)


@triton.jit
def _merge_kernel(
    partials_ptr,
    sched_ptr,
    out_ptr,
    lse_ptr,
    cu_seqlens_q_ptr,
    stride_p_item,
    stride_p_head,
    stride_o_tok,
    stride_o_head,
    stride_lse_tok,
    stride_lse_head,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    ITEMS_BLOCK: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    ROWS_FROM_CU: tl.constexpr,
    MUTANT: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq
    if ROWS_FROM_CU:
        # Unified decode: the sequence's query token; a sequence without one was not run.
        row = tl.load(cu_seqlens_q_ptr + seq)
        if tl.load(cu_seqlens_q_ptr + seq + 1) == row:
            return
    first = tl.load(sched_ptr + 2 * seq)
    count = tl.load(sched_ptr + 2 * seq + 1)

    # Online log-sum-exp over the sequence's items, ITEMS_BLOCK at a time.
    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < HEAD_SIZE
    offs_i = tl.arange(0, ITEMS_BLOCK)
    acc = tl.zeros([HEAD_PAD], dtype=tl.float32)
    lse_max = tl.max(tl.full([ITEMS_BLOCK], float("-inf"), dtype=tl.float32), axis=0)
    denom = tl.sum(tl.zeros([ITEMS_BLOCK], dtype=tl.float32), axis=0)
    for block in range(0, count, ITEMS_BLOCK):
        items = first + block + offs_i
        ok = block + offs_i < count
        rows = partials_ptr + items.to(tl.int64) * stride_p_item + head * stride_p_head
        lse = tl.load(rows + HEAD_SIZE, mask=ok, other=float("-inf"))
        if MUTANT == "split_lse_merge":
            # The mutant: the last of more than one piece weighs in with its lse off by 1/16.
            lse = tl.where((block + offs_i == count - 1) & (count > 1), lse + 0.0625, lse)
        if MUTANT == "split_lse_base2":
            # The mutant: the last of more than one piece hands its lse in base 2 (lse * log2 e).
            lse = tl.where((block + offs_i == count - 1) & (count > 1), lse * 1.4426950408889634, lse)
        new_max = tl.maximum(lse_max, tl.max(lse, axis=0))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        weight = tl.exp(lse - safe_max)
        values = tl.load(rows[:, None] + offs_d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
        rescale = tl.exp(lse_max - safe_max)
        acc = acc * rescale + tl.sum(weight[:, None] * values, axis=0)
        denom = denom * rescale + tl.sum(weight, axis=0)
        lse_max = new_max

    result = acc / tl.where(denom > 0.0, denom, 1.0)
    tl.store(out_ptr + row.to(tl.int64) * stride_o_tok + head * stride_o_head + offs_d, result, mask=d_ok)
    if WRITE_LSE:
        lse = tl.where(denom > 0.0, lse_max + tl.log(tl.maximum(denom, 1e-30)), float("-inf"))
        tl.store(lse_ptr + row.to(tl.int64) * stride_lse_tok + head * stride_lse_head, lse)


# Both kernels put the work items on the grid's second axis (a head group's items are
# neighbours in launch order), which CUDA caps at 65,535 programs.
MAX_WORK_ITEMS = 65535
MERGE_MUTANTS = ("split_lse_merge", "split_lse_base2")  # the mutants the merge carries (kernels.mutants)


def work_items(target: int, num_seqs: int) -> int:
    """The grid's work items per head group for a ``target`` and a batch of ``num_seqs``: the
    target, or one per sequence plus half the target once the batch passes half the target,
    so that a long sequence in a large batch is still cut into pieces."""
    items = max(target, num_seqs + target // 2)
    if items > MAX_WORK_ITEMS:
        raise ValueError(
            f"split-KV decode: {num_seqs} sequences with a target of {target} work items need {items} "
            f"grid rows, more than the {MAX_WORK_ITEMS} a launch can have"
        )
    return items


def schedule_lanes(num_seqs: int, wide: bool = True) -> int:
    """Lanes of the per-sequence vectors (``seqs``) a split program finds its piece in: a power
    of two, and with ``wide`` at least a warp's 32. Compiled for sm_90 by Triton 3.6, 4 to 16
    lanes cost the GQA split decode 20-70 registers (a program fewer on each multiprocessor)
    and make 64-head MLA programs spill; 32 lanes do neither (``scripts/kernel_resources.py``).
    MLA programs of up to 32 heads ran up to 9% slower with wide vectors, so they keep the batch's."""
    return max(32 if wide else 1, triton.next_power_of_2(num_seqs))


def split_scratch(num_items: int, num_seqs: int, num_heads: int, head_size: int, device: torch.device):
    """The partials ``[items, heads, head_size + 1]`` and the schedule ``[seqs, 2]``.

    Allocated per call: under CUDA-graph capture PyTorch's caching allocator serves them
    from the graph's private pool, so every replay reuses the same memory.
    """
    partials = torch.empty((num_items, num_heads, head_size + 1), dtype=torch.float32, device=device)
    return partials, torch.empty((max(num_seqs, 1), 2), dtype=torch.int32, device=device)


def merge_splits(
    partials: torch.Tensor,
    sched: torch.Tensor,
    num_seqs: int,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    mutant: str = "",
) -> None:
    """Combine each sequence's items into ``out[row]`` (and ``lse``, natural log).

    The row is the sequence, or with ``cu_seqlens_q`` its query token (decode: one query
    per sequence). A sequence with no item gets a zero output and ``lse = -inf``.
    ``mutant`` "split_lse_merge" or "split_lse_base2" merges with one piece's lse off
    (``kernels.mutants``); any other value merges as the fixed kernels do.
    """
    if num_seqs == 0:
        return
    num_heads, width = partials.shape[1], partials.shape[2]
    _merge_kernel[(num_seqs, num_heads)](
        partials,
        sched,
        out,
        lse if lse is not None else out,
        cu_seqlens_q if cu_seqlens_q is not None else sched,
        partials.stride(0),
        partials.stride(1),
        out.stride(0),
        out.stride(1),
        lse.stride(0) if lse is not None else 0,
        lse.stride(1) if lse is not None else 0,
        HEAD_SIZE=width - 1,
        HEAD_PAD=triton.next_power_of_2(width - 1),
        ITEMS_BLOCK=8,
        WRITE_LSE=lse is not None,
        ROWS_FROM_CU=cu_seqlens_q is not None,
        MUTANT=mutant if mutant in MERGE_MUTANTS else "",
        num_warps=4,
    )
