# mypy: disable-error-code="no-untyped-def"
# Triton reads a kernel parameter's annotation as its type (tl.constexpr, tl.int64), so the
# @triton.jit functions leave tensors and scalars unannotated.
"""The Triton programs of ``kernels.unified_attention``: a block of queries over its key tiles.

The launcher there (vLLM's arguments, launch defaults, grid, split-KV scratch and merge) picks
the constexprs; the fix, the legacy bound (``READ_PAST_SEQ_LEN``) and the mutants' ``MUTANT``
switches that its docstring describes are compiled here. The programs live apart from the
launch code so that either can change while the other stays as it was
(``scripts/kernel_resources.py`` digests their machine code).
"""

import triton
import triton.language as tl

from kernels._split_kv import balanced_piece, piece_floor


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
