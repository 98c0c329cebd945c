# mypy: disable-error-code="no-untyped-def"
# Triton reads a kernel parameter's annotation as its type (tl.constexpr, tl.int64), so the
# @triton.jit functions leave tensors and scalars unannotated.
"""Paged attention over vLLM's KV cache for mixed prefill/decode batches.

The entry point has the argument names and order of vLLM's
``vllm.v1.attention.ops.triton_unified_attention.unified_attention`` (0.24.x and 0.25.x), so
vLLM's TRITON_ATTN backend can call it unchanged; it also serves Whisper's non-causal
cross-attention.

The fix (vLLM PR #47305): no K/V load and no block-table load for a key position
``>= seq_len``, and the non-causal loop ends at ``seq_len``. A block's unwritten tail may
hold NaN, and a masked score only gives it weight 0: ``0 * NaN`` is NaN. The tail mask is
applied only on the tiles that straddle a bound, so the fix costs nothing on the others.
``variant="legacy"`` (and the mutant ``tail_read``) reproduces the pre-fix reads (bound derived
causally, block table read for the whole tile) to prove that tests and the accuracy gate catch
the bug. The other mutants this kernel carries (``kernels.mutants``: chunk_context_skip,
batch_row_shift, split_lse_merge, window_edge_leak, softmax_scale_drift) are ``MUTANT``
switches that the fixed variant leaves off, so its compiled code does not change.
"""

import torch
import triton
import triton.language as tl

from kernels import mutants
from kernels._launch import Launch, LaunchConfig, sm_count
from kernels._split_kv import (
    balanced_piece,
    merge_splits,
    piece_floor,
    schedule_lanes,
    split_scratch,
    work_items,
)
from kernels._vllm_args import check_unified_layout, refuse_unsupported_unified


@triton.jit
def _find_seq(cu_seqlens_q_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """Sequence owning global query block ``q_block`` (blocks of seq i start at cu[i]//BLOCK_Q + i)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_tiles(
    acc,
    m_i,
    l_i,
    q,
    tile_lo,
    tile_hi,
    k_ptr,
    v_ptr,
    table_row_ptr,
    kv_head,
    stride_k_blk,
    stride_k_pos,
    stride_k_head,
    stride_k_dim,
    stride_v_blk,
    stride_v_pos,
    stride_v_head,
    stride_v_dim,
    scale,
    softcap,
    q_abs,
    row_valid,
    seq_len,
    load_limit,
    drop_lo,
    drop_hi,
    shift_tile,
    shift_offset,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    MASKED: tl.constexpr,
    READ_PAST_SEQ_LEN: tl.constexpr,
    MUTANT: tl.constexpr,
):
    """Online-softmax accumulation over tiles [tile_lo, tile_hi) of TILE key positions.

    MASKED tiles straddle a bound (seq_len, causal diagonal, window edge): loads stop at
    ``load_limit`` and scores are masked. Other tiles lie wholly inside every bound and
    run without masks.

    ``MUTANT`` (kernels.mutants; "" for fixed and legacy) switches on one catalogued bug:
    chunk_context_skip masks the keys [drop_lo, drop_hi) in every tile; batch_row_shift moves
    tile ``shift_tile``'s block-table reads by ``shift_offset``; window_edge_leak widens the
    window's lower edge by one tile.
    """
    window_left = WINDOW
    if MUTANT == "window_edge_leak":
        window_left = WINDOW + TILE
    offs_t = tl.arange(0, TILE)
    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < HEAD_SIZE
    for j in tl.range(tile_lo, tile_hi):
        pos = j * TILE + offs_t
        kv_mask = d_ok[None, :]
        row_ptr = table_row_ptr
        if MUTANT == "batch_row_shift":
            row_ptr = table_row_ptr + tl.where(j == shift_tile, shift_offset, 0)
        if MASKED:
            readable = pos < load_limit
            kv_mask = kv_mask & readable[:, None]
            if READ_PAST_SEQ_LEN:
                block = tl.load(row_ptr + pos // BLOCK_SIZE)
            else:
                block = tl.load(row_ptr + pos // BLOCK_SIZE, mask=readable, other=0)
        else:
            block = tl.load(row_ptr + pos // BLOCK_SIZE)
        block = block.to(tl.int64)
        k_rows = k_ptr + block * stride_k_blk + (pos % BLOCK_SIZE) * stride_k_pos + kv_head * stride_k_head
        v_rows = v_ptr + block * stride_v_blk + (pos % BLOCK_SIZE) * stride_v_pos + kv_head * stride_v_head
        k_ptrs = k_rows[:, None] + offs_d[None, :] * stride_k_dim
        v_ptrs = v_rows[:, None] + offs_d[None, :] * stride_v_dim
        if MASKED or HEAD_PAD != HEAD_SIZE:
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
            v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)

        s = tl.dot(q, tl.trans(k))
        if USE_SOFTCAP:
            s = softcap * (2.0 * tl.sigmoid(2.0 * (s * scale) / softcap) - 1.0) * 1.4426950408889634
        else:
            s = s * (scale * 1.4426950408889634)
        if MASKED:
            ok = row_valid[:, None] & (pos < seq_len)[None, :]
            if CAUSAL:
                ok = ok & (pos[None, :] <= q_abs[:, None])
            if WINDOW > 0:
                ok = ok & ((q_abs[:, None] - pos[None, :]) < window_left)
                if not CAUSAL:
                    ok = ok & ((pos[None, :] - q_abs[:, None]) < WINDOW)
            s = tl.where(ok, s, float("-inf"))
        if MUTANT == "chunk_context_skip":
            s = tl.where(((pos >= drop_lo) & (pos < drop_hi))[None, :], float("-inf"), s)
        if MASKED or MUTANT == "chunk_context_skip":
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _decode_tile_range(seq_len, Q_PER_KV, TILE, BLOCK_M, CAUSAL, WINDOW, READ_PAST_SEQ_LEN):
    """Key tiles [lo, hi) that the kernel's bounds give a decode query (the last position of
    its sequence), for a vector of sequence lengths: what the work items divide."""
    lo = seq_len * 0
    if WINDOW > 0:
        lo = tl.maximum(seq_len - WINDOW, 0) // TILE
    end = seq_len
    if READ_PAST_SEQ_LEN and not CAUSAL and WINDOW == 0:
        end = seq_len + (BLOCK_M - 1) // Q_PER_KV
    return lo, tl.maximum(tl.cdiv(end, TILE), lo)


@triton.jit(do_not_specialize=["num_seqs", "num_items", "min_tiles", "fill_items"])
def _unified_attention_kernel(
    out_ptr,
    partials_ptr,
    sched_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    block_table_ptr,
    seq_lens_ptr,
    cu_seqlens_q_ptr,
    scale,
    softcap,
    num_seqs,
    num_items,
    min_tiles,
    fill_items,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_k_blk,
    stride_k_pos,
    stride_k_head,
    stride_k_dim,
    stride_v_blk,
    stride_v_pos,
    stride_v_head,
    stride_v_dim,
    stride_table_seq,
    stride_p_item,
    stride_p_head,
    Q_PER_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    SPLIT: tl.constexpr,
    READ_PAST_SEQ_LEN: tl.constexpr,
    SEQS_PAD: tl.constexpr,
    MUTANT: tl.constexpr,
):
    # One program: BLOCK_Q query tokens x Q_PER_KV heads of one KV head (BLOCK_M rows)
    # over their key range or, with SPLIT (decode-only batches: one query per sequence),
    # over one work item: a token-balanced piece of one sequence's key tiles.
    window_left = WINDOW
    if MUTANT == "window_edge_leak":
        window_left = WINDOW + TILE
    if SPLIT:
        # The KV heads of an item are neighbours in launch order, so the items that hold
        # pieces start first and the grid's spare items (short batches) queue behind them.
        kv_head = tl.program_id(0)
        item = tl.program_id(1)
        seqs = tl.arange(0, SEQS_PAD)
        lens = tl.load(seq_lens_ptr + seqs, mask=seqs < num_seqs, other=0)
        lo_tiles, hi_tiles = _decode_tile_range(lens, Q_PER_KV, TILE, BLOCK_M, CAUSAL, window_left, READ_PAST_SEQ_LEN)
        work = hi_tiles - lo_tiles
        floor = piece_floor(work, min_tiles, fill_items)
        seq, piece_first, piece_tiles = balanced_piece(
            work, seqs, num_seqs, item, num_items, floor, sched_ptr, (item == 0) & (kv_head == 0)
        )
        if seq >= num_seqs:
            return
        first_q = 0
    else:
        kv_head = tl.program_id(1)
        q_block = tl.program_id(0)
        seq = _find_seq(cu_seqlens_q_ptr, q_block, num_seqs, BLOCK_Q)
        first_q = (q_block - (tl.load(cu_seqlens_q_ptr + seq) // BLOCK_Q + seq)) * BLOCK_Q
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    query_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if first_q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    rows = tl.arange(0, BLOCK_M)
    q_pos = first_q + rows // Q_PER_KV
    head = kv_head * Q_PER_KV + rows % Q_PER_KV
    row_valid = (rows // Q_PER_KV < BLOCK_Q) & (q_pos < query_len)
    q_abs = context_len + q_pos
    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < HEAD_SIZE
    token = (q_start + q_pos).to(tl.int64)
    q = tl.load(
        q_ptr + token[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
        mask=row_valid[:, None] & d_ok[None, :],
        other=0.0,
    )

    # Key ranges: [any_lo, any_hi) is allowed for some row of the block, [all_lo, all_hi)
    # for every row; tiles inside the latter need no mask.
    qa_first = context_len + first_q
    qa_last = context_len + tl.minimum(first_q + BLOCK_Q, query_len) - 1
    any_lo = 0
    all_lo = 0
    if CAUSAL:
        any_hi = qa_last + 1
        all_hi = qa_first + 1
    else:
        any_hi = seq_len
        all_hi = seq_len
    if WINDOW > 0:
        any_lo = tl.maximum(qa_first - window_left + 1, 0)
        all_lo = tl.maximum(qa_last - window_left + 1, 0)
        if not CAUSAL:
            any_hi = tl.minimum(qa_last + WINDOW, seq_len)
            all_hi = tl.minimum(qa_first + WINDOW, seq_len)

    load_limit = seq_len
    tile_hi = tl.cdiv(any_hi, TILE)
    if READ_PAST_SEQ_LEN:
        # Pre-fix bound: the longest causal prefix of the block, widened to seq_len when
        # non-causal, so non-causal queries read the block tail past seq_len.
        load_limit = context_len + first_q + (BLOCK_M - 1) // Q_PER_KV + 1
        if CAUSAL:
            load_limit = tl.minimum(load_limit, seq_len)
        else:
            load_limit = tl.maximum(load_limit, seq_len)
            if WINDOW == 0:
                tile_hi = tl.cdiv(load_limit, TILE)

    tile_lo = any_lo // TILE
    if SPLIT:
        tile_lo = tile_lo + piece_first
        tile_hi = tl.minimum(tile_lo + piece_tiles, tile_hi)
    full_lo = tl.minimum(tl.maximum(tl.cdiv(all_lo, TILE), tile_lo), tile_hi)
    full_hi = tl.minimum(tl.maximum(all_hi // TILE, full_lo), tile_hi)

    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    table_row_ptr = block_table_ptr + seq.to(tl.int64) * stride_table_seq
    drop_lo = 0
    drop_hi = 0
    if MUTANT == "chunk_context_skip":
        # The chunk drops its last context tile: keys [start of the tile of context_len - 1, context_len).
        chunk = (query_len > 1) & (context_len > 0)
        drop_lo = tl.where(chunk, (tl.maximum(context_len, 1) - 1) // TILE * TILE, 0)
        drop_hi = tl.where(chunk, context_len, 0)
    shift_tile = -1
    shift_offset = 0
    if MUTANT == "batch_row_shift":
        # A sequence after the first reads its last key's tile through the row before its own.
        shift_tile = tl.where(seq > 0, (seq_len - 1) // TILE, -1)
        shift_offset = -stride_table_seq
    for part in tl.static_range(3):
        # part 0: leading masked tiles (window edge), 1: unmasked, 2: trailing masked tiles.
        if part == 0:
            lo = tile_lo
            hi = full_lo
        elif part == 1:
            lo = full_lo
            hi = full_hi
        else:
            lo = full_hi
            hi = tile_hi
        acc, m_i, l_i = _attend_tiles(
            acc, m_i, l_i, q, lo, hi,
            k_ptr, v_ptr, table_row_ptr, kv_head,
            stride_k_blk, stride_k_pos, stride_k_head, stride_k_dim,
            stride_v_blk, stride_v_pos, stride_v_head, stride_v_dim,
            scale, softcap, q_abs, row_valid, seq_len, load_limit,
            drop_lo, drop_hi, shift_tile, shift_offset,
            BLOCK_SIZE, TILE, HEAD_SIZE, HEAD_PAD, CAUSAL, WINDOW, USE_SOFTCAP,
            part != 1, READ_PAST_SEQ_LEN, MUTANT,
        )  # fmt: skip

    result = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    store_mask = row_valid[:, None] & d_ok[None, :]
    if not SPLIT:
        out_ptrs = out_ptr + token[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :]
        tl.store(out_ptrs, result, mask=store_mask)
    else:
        part_rows = partials_ptr + item.to(tl.int64) * stride_p_item + head * stride_p_head
        tl.store(part_rows[:, None] + offs_d[None, :], result, mask=store_mask)
        lse = tl.where(l_i > 0.0, (m_i + tl.log2(tl.maximum(l_i, 1e-30))) * 0.6931471805599453, float("-inf"))
        tl.store(part_rows + HEAD_SIZE, lse, mask=row_valid)


# A program (16 query rows, 32-key tiles, 4 warps) has about 200 registers a thread on
# sm_90, so 2 stay resident per multiprocessor. Split decode takes 64-key tiles (0.84-0.91x
# the time of 32-key ones on ragged batches on the H200 sweep, the same on uniform ones) in
# a 2-stage pipeline (0.89x the time of 3 stages at 64 x 8k uniform, 0.96-0.98x on ragged
# batches: two 32 KB stages still keep enough reads in flight, and cost less shared memory).
# Decode-only batches are split into token-balanced work items (kernels._split_kv) for 16
# programs per multiprocessor: several waves, so that the launch order evens out what the
# pieces' rounding leaves (a GQA piece's partial is a few KB; 16 against 8 was 0.94-0.98x
# the time on ragged batches of 48 to 256 sequences on the H200 sweep, 1.01x on a uniform
# one); a batch larger than the target gets half the target more
# (kernels._split_kv.work_items), so that its long sequences are still cut. Pieces keep at
# least 512 keys (an explicit num_splits drops that floor), which leaves short batches with
# fewer pieces than items, unless the whole batch would then give fewer than 3 programs per
# multiprocessor: there the floor gives way to fill that many (kernels._split_kv.piece_floor).
# On the H200 a fill of 2 took 0.73-0.88x the time of 512-key pieces on the nine batches of
# 1 to 12 sequences where it gave way; with 4 programs resident a multiprocessor at every
# batch size (kernels._split_kv.schedule_lanes), a fill of 3 took 0.86-1.005x the time of 2
# on 43 batches, and 4 ranged 0.84-1.21x. Batches whose longest sequence is short run unsplit.
_PROGRAMS_PER_SM = 16
_MIN_KEYS_PER_SPLIT = 512
_FILL_PROGRAMS_PER_SM = 3


def query_rows(q_per_kv: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_Q): a program's rows, a KV head's query heads for BLOCK_Q tokens; at
    least 16 rows, the smallest tile ``tl.dot`` takes."""
    block_m = 16 if q_per_kv <= 16 else triton.next_power_of_2(q_per_kv)
    return block_m, block_m // q_per_kv


def _default_launch(decode_only: bool, num_kv_heads: int, max_seqlen_k: int, num_sms: int) -> Launch:
    items = _PROGRAMS_PER_SM * num_sms // num_kv_heads
    split = decode_only and max_seqlen_k >= 2 * _MIN_KEYS_PER_SPLIT
    if not split:
        return Launch(tile=32, num_warps=4, num_stages=3, num_splits=1, heads_per_program=1, row_tma=False)
    return Launch(tile=64, num_warps=4, num_stages=2, num_splits=items, heads_per_program=1, row_tma=False)


def unified_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    seqused_k: torch.Tensor,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool | torch.Tensor,
    window_size: tuple[int, int] | list[int],
    block_table: torch.Tensor,
    softcap: float,
    q_descale: torch.Tensor | None,
    k_descale: torch.Tensor | None,
    v_descale: torch.Tensor | None,
    seq_threshold_3D: int | None = None,
    num_par_softmax_segments: int | None = None,
    softmax_segm_output: torch.Tensor | None = None,
    softmax_segm_max: torch.Tensor | None = None,
    softmax_segm_expsum: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    output_scale: torch.Tensor | None = None,
    qq_bias: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    mm_prefix_range: torch.Tensor | None = None,
    rswa_prefix_lens: torch.Tensor | None = None,
    rswa_window: int | None = None,
    use_alibi_sqrt: bool = False,
    kv_quant_mode: int = 0,
    k_scale_cache: torch.Tensor | None = None,
    v_scale_cache: torch.Tensor | None = None,
    chunk_lookback: int = -1,
    use_td: bool = False,
    mm_prefix_clamp_sliding_window: bool = False,
    *,
    variant: str = "fixed",
    config: LaunchConfig | None = None,
) -> None:
    """Write attention of ``q`` over the paged ``k``/``v`` cache into ``out``.

    Layouts as in vLLM: q/out ``[num_tokens, num_heads, head_size]``; k/v
    ``[num_blocks, block_size, num_kv_heads, head_size]`` with any strides; int32
    ``block_table [num_seqs, max_blocks]``, ``seqused_k [num_seqs]`` and
    ``cu_seqlens_q [num_seqs + 1]``. ``window_size[0] >= 0`` enables a sliding window of
    ``window_size[0] + 1`` keys (both sides when non-causal, as in vLLM).

    vLLM's 3D scratch buffers (``seq_threshold_3D``, ``softmax_segm_*``) are accepted and
    unused: the kernel sizes its own split-KV scratch. ``k_descale``/``v_descale`` only
    matter for fp8 KV caches, which are refused, so they are ignored (vLLM passes its
    layer scales of 1.0). ``use_td`` is a load strategy for Intel GPUs with no effect on
    the result. ``mm_prefix_clamp_sliding_window`` only matters with ``mm_prefix_range``,
    which is refused. Every other feature vLLM can ask for raises NotImplementedError.
    ``config`` overrides the launch parameters (benchmarks).
    """
    mutants.check_variant("unified_attention", variant)
    refuse_unsupported_unified(causal, q_descale, dict(locals()))
    check_unified_layout(q, k, v, out)
    num_seqs = seqused_k.shape[0]
    if cu_seqlens_q.shape[0] != num_seqs + 1 or block_table.shape[0] < num_seqs:
        raise ValueError(
            f"unified_attention: cu_seqlens_q needs {num_seqs + 1} entries and block_table {num_seqs} rows, "
            f"got {cu_seqlens_q.shape[0]} and {block_table.shape[0]}"
        )

    num_tokens, num_q_heads, head_size = q.shape
    block_size, num_kv_heads = k.shape[1], k.shape[2]
    q_per_kv = num_q_heads // num_kv_heads
    block_m, block_q = query_rows(q_per_kv)
    num_q_blocks = num_tokens // block_q + num_seqs
    decode_only = max_seqlen_q == 1
    config = config or LaunchConfig()
    default = _default_launch(decode_only, num_kv_heads, max_seqlen_k, sm_count(q.device))
    launch = config.resolve(default)
    split = decode_only and launch.num_splits > 1
    window = window_size[0] + 1 if window_size[0] >= 0 else 0
    mutant = mutants.in_kernel(variant, mutants.UNIFIED)

    # Split: the grid is fixed by the batch size (CUDA graphs), the pieces follow seqused_k
    # on the device.
    num_items = work_items(launch.num_splits, num_seqs) if split else 0
    min_tiles = 1 if config.num_splits else triton.cdiv(_MIN_KEYS_PER_SPLIT, launch.tile)
    fill_items = max(_FILL_PROGRAMS_PER_SM * sm_count(q.device) // num_kv_heads, 1)
    partials, sched = split_scratch(num_items, num_seqs, num_q_heads, head_size, q.device) if split else (out, out)
    _unified_attention_kernel[(num_kv_heads, num_items) if split else (num_q_blocks, num_kv_heads)](
        out, partials, sched, q, k, v, block_table, seqused_k, cu_seqlens_q,
        mutants.drifted_scale(softmax_scale) if variant == "softmax_scale_drift" else softmax_scale,
        softcap, num_seqs, num_items, min_tiles, fill_items,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        block_table.stride(0),
        partials.stride(0), partials.stride(1),
        Q_PER_KV=q_per_kv,
        BLOCK_SIZE=block_size,
        TILE=launch.tile,
        HEAD_SIZE=head_size,
        HEAD_PAD=max(16, triton.next_power_of_2(head_size)),
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        CAUSAL=bool(causal),
        WINDOW=window,
        USE_SOFTCAP=softcap > 0,
        SPLIT=split,
        READ_PAST_SEQ_LEN=mutants.has(variant, "tail_read"),
        SEQS_PAD=schedule_lanes(num_seqs),
        MUTANT=mutant,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )  # fmt: skip
    if split:
        merge_splits(partials, sched, num_seqs, out, cu_seqlens_q=cu_seqlens_q, mutant=mutant)
