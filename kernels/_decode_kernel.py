# mypy: disable-error-code="no-untyped-def"
# Triton reads a kernel parameter's annotation as its type (tl.constexpr, tl.int64), so the
# @triton.jit functions leave tensors and scalars unannotated.
"""The Triton programs of ``kernels.decode_attention``: stage 1, one head group over one work item.

The launcher there (vLLM's arguments, launch defaults, TMA descriptors, grid, split-KV
scratch and the stage-2 merge) picks the constexprs; the fix (``PAGE_OFFSET_INT64``) and the
mutants' ``MUTANT`` switches that its docstring describes are compiled here. The programs
live apart from the launch code so that either can change while the other stays as it was
(``scripts/kernel_resources.py`` digests their machine code).
"""

import triton
import triton.language as tl

from kernels._split_kv import balanced_piece


@triton.jit
def _tile_ptrs(
    base_ptr, page, page_b, in_b, stride_page, row_offs, cols, PAGE_OFFSET_INT64: tl.constexpr, PAGES: tl.constexpr
):
    """Pointers ``base + page * stride_page + row_offs[:, None] + cols[None, :]``. PAGES says
    how the tile's page ids come: 1, one scalar ``page``; 2, two scalars, ``page_b`` for the
    rows where ``in_b`` (a tile that meets two pages); 0, one page id per row in ``page``.
    Only the page products need int64; the in-page offsets stay int32 and are added to a
    page's base pointer."""
    offs = row_offs[:, None] + cols[None, :]
    if PAGE_OFFSET_INT64:
        if PAGES == 2:
            ptrs_a = (base_ptr + page.to(tl.int64) * stride_page) + offs
            ptrs_b = (base_ptr + page_b.to(tl.int64) * stride_page) + offs
            ptrs = tl.where(in_b[:, None], ptrs_b, ptrs_a)
        elif PAGES == 1:
            ptrs = (base_ptr + page.to(tl.int64) * stride_page) + offs
        else:
            ptrs = (base_ptr + page[:, None].to(tl.int64) * stride_page) + offs
    else:
        # Pre-fix arithmetic: the whole offset in int32, which wraps past 2^31 elements.
        if PAGES == 2:
            page = tl.where(in_b, page_b, page)
        if PAGES != 1:
            page = page[:, None]
        ptrs = base_ptr + (page * stride_page + offs)
    return ptrs


@triton.jit
def _decode_tiles(
    acc,
    m_i,
    l_i,
    q_main,
    q_rope,
    start,
    num_tiles,
    end,
    k_ptr,
    v_ptr,
    k_rows_desc,
    rope_rows_desc,
    table_row_ptr,
    kv_head,
    stride_k_page,
    stride_k_pos,
    stride_k_head,
    stride_v_page,
    stride_v_pos,
    stride_v_head,
    scale,
    logit_cap,
    shift_start,
    shift_offset,
    QK_MAIN: tl.constexpr,
    QK_MAIN_PAD: tl.constexpr,
    QK_ROPE: tl.constexpr,
    QK_ROPE_PAD: tl.constexpr,
    V_DIM: tl.constexpr,
    V_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    PAGES: tl.constexpr,
    V_IS_K_MAIN: tl.constexpr,
    USE_LOGIT_CAP: tl.constexpr,
    PAGE_OFFSET_INT64: tl.constexpr,
    MASKED: tl.constexpr,
    ROW_TMA: tl.constexpr,
    MUTANT: tl.constexpr,
):
    """Online-softmax accumulation over ``num_tiles`` tiles of TILE keys from ``start``.

    Only the MASKED call (the sequence's last, partial tile) masks loads at ``end``. When
    tiles never straddle a page (PAGES == 1), a tile's page id is one scalar: one table load
    and one int64 product per tile instead of one per key; when a tile meets at most two
    pages (PAGES == 2: tiles no longer than pages they do not divide), two. The second page
    id is read at the tile's last key inside the sequence, never past it.

    With ROW_TMA (MLA on pages the tiles divide, ``fixed``), an unmasked tile is a block of
    rows of the cache viewed as ``[pages * PAGE_SIZE, Lk]``, copied by the tensor memory
    accelerator: no per-element addresses in registers. The row index is the page id times
    PAGE_SIZE in int32, which the host allows only when every row index fits; the hardware
    forms the byte offset in 64 bits. The masked tile keeps masked pointer loads, so nothing
    at or past ``end`` is read.

    ``MUTANT`` "batch_row_shift" (kernels.mutants) reads the table through ``table_row_ptr +
    shift_offset`` for the tile that starts at ``shift_start``; fixed leaves it "".
    """
    tl.static_assert(not ROW_TMA or PAGES == 1, "TMA copies take tiles that lie in one page")
    offs_n = tl.arange(0, TILE)
    d_main = tl.arange(0, QK_MAIN_PAD)
    d_v = tl.arange(0, V_PAD)
    for t in tl.range(0, num_tiles):
        pos = start + t * TILE + offs_n
        in_seq = pos < end
        first = (start + t * TILE) // PAGE_SIZE
        page_b = first
        in_b = in_seq
        row_ptr = table_row_ptr
        if MUTANT == "batch_row_shift":
            row_ptr = table_row_ptr + tl.where(start + t * TILE == shift_start, shift_offset, 0)
        if PAGES == 1:
            page = tl.load(row_ptr + first)
        elif PAGES == 2:
            page = tl.load(row_ptr + first)
            page_b = tl.load(row_ptr + (tl.minimum(start + t * TILE + TILE, end) - 1) // PAGE_SIZE)
            in_b = pos // PAGE_SIZE > first
        elif MASKED:
            page = tl.load(row_ptr + pos // PAGE_SIZE, mask=in_seq, other=0)
        else:
            page = tl.load(row_ptr + pos // PAGE_SIZE)
        k_rows = (pos % PAGE_SIZE) * stride_k_pos + kv_head * stride_k_head
        if ROW_TMA and not MASKED:
            row = page * PAGE_SIZE + (start + t * TILE) % PAGE_SIZE
            k_main = k_rows_desc.load([row, 0])
        else:
            k_ptrs = _tile_ptrs(k_ptr, page, page_b, in_b, stride_k_page, k_rows, d_main, PAGE_OFFSET_INT64, PAGES)
            if MASKED or QK_MAIN != QK_MAIN_PAD:
                k_main = tl.load(k_ptrs, mask=in_seq[:, None] & (d_main < QK_MAIN)[None, :], other=0.0)
            else:
                k_main = tl.load(k_ptrs)
        s = tl.dot(q_main, tl.trans(k_main))
        if QK_ROPE > 0:
            d_rope = tl.arange(0, QK_ROPE_PAD)
            if ROW_TMA and not MASKED:
                k_rope = rope_rows_desc.load([row, QK_MAIN])
            else:
                rope_ptrs = _tile_ptrs(
                    k_ptr, page, page_b, in_b, stride_k_page, k_rows, QK_MAIN + d_rope, PAGE_OFFSET_INT64, PAGES
                )
                if MASKED or QK_ROPE != QK_ROPE_PAD:
                    k_rope = tl.load(rope_ptrs, mask=in_seq[:, None] & (d_rope < QK_ROPE)[None, :], other=0.0)
                else:
                    k_rope = tl.load(rope_ptrs)
            s += tl.dot(q_rope, tl.trans(k_rope))
        s = s * scale
        if USE_LOGIT_CAP:
            s = logit_cap * (2.0 * tl.sigmoid(2.0 * s / logit_cap) - 1.0)
        s = s * 1.4426950408889634
        if MASKED:
            s = tl.where(in_seq[None, :], s, float("-inf"))

        if V_IS_K_MAIN:
            v = k_main
        else:
            v_rows = (pos % PAGE_SIZE) * stride_v_pos + kv_head * stride_v_head
            v_ptrs = _tile_ptrs(v_ptr, page, page_b, in_b, stride_v_page, v_rows, d_v, PAGE_OFFSET_INT64, PAGES)
            if MASKED or V_DIM != V_PAD:
                v = tl.load(v_ptrs, mask=in_seq[:, None] & (d_v < V_DIM)[None, :], other=0.0)
            else:
                v = tl.load(v_ptrs)

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["num_seqs", "num_items", "min_tiles"])
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    seq_lens_ptr,
    partials_ptr,
    sched_ptr,
    k_rows_desc,
    rope_rows_desc,
    scale,
    logit_cap,
    num_seqs,
    num_items,
    min_tiles,
    stride_q_tok,
    stride_q_head,
    stride_k_page,
    stride_k_pos,
    stride_k_head,
    stride_v_page,
    stride_v_pos,
    stride_v_head,
    stride_table_seq,
    stride_p_item,
    stride_p_head,
    Q_PER_KV: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    BLOCKS_PER_KV: tl.constexpr,
    BLOCK_H: tl.constexpr,
    QK_MAIN: tl.constexpr,
    QK_MAIN_PAD: tl.constexpr,
    QK_ROPE: tl.constexpr,
    QK_ROPE_PAD: tl.constexpr,
    V_DIM: tl.constexpr,
    V_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    PAGES: tl.constexpr,
    V_IS_K_MAIN: tl.constexpr,
    USE_LOGIT_CAP: tl.constexpr,
    PAGE_OFFSET_INT64: tl.constexpr,
    SEQS_PAD: tl.constexpr,
    ROW_TMA: tl.constexpr,
    MUTANT: tl.constexpr,
):
    # One program: HEADS_PER_PROGRAM query heads of one KV head over one work item (a piece
    # of one sequence's keys). The head groups of an item are neighbours in launch order,
    # so with several groups per KV head the later ones find the keys in L2.
    head_block = tl.program_id(0)
    item = tl.program_id(1)
    seqs = tl.arange(0, SEQS_PAD)
    lens = tl.load(seq_lens_ptr + seqs, mask=seqs < num_seqs, other=0)
    seq, first_tile, num_tiles = balanced_piece(
        tl.cdiv(lens, TILE), seqs, num_seqs, item, num_items, min_tiles, sched_ptr, (item == 0) & (head_block == 0)
    )
    if seq >= num_seqs:
        return
    kv_head = head_block // BLOCKS_PER_KV
    group_first = (head_block % BLOCKS_PER_KV) * HEADS_PER_PROGRAM
    rows = tl.arange(0, BLOCK_H)
    heads = kv_head * Q_PER_KV + group_first + rows
    head_ok = (rows < HEADS_PER_PROGRAM) & (group_first + rows < Q_PER_KV)

    q_rows = q_ptr + seq.to(tl.int64) * stride_q_tok + heads * stride_q_head
    d_main = tl.arange(0, QK_MAIN_PAD)
    q_main = tl.load(q_rows[:, None] + d_main[None, :], mask=head_ok[:, None] & (d_main < QK_MAIN)[None, :], other=0.0)
    q_rope = q_main
    if QK_ROPE > 0:
        d_rope = tl.arange(0, QK_ROPE_PAD)
        rope_mask = head_ok[:, None] & (d_rope < QK_ROPE)[None, :]
        q_rope = tl.load(q_rows[:, None] + QK_MAIN + d_rope[None, :], mask=rope_mask, other=0.0)

    # Pieces are whole tiles, so only the sequence's last tile is partial and masked.
    start = first_tile * TILE
    end = tl.minimum(start + num_tiles * TILE, tl.sum(tl.where(seqs == seq, lens, 0)))
    num_full = tl.maximum(end - start, 0) // TILE

    acc = tl.zeros([BLOCK_H, V_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    table_row_ptr = table_ptr + seq.to(tl.int64) * stride_table_seq
    shift_start = -1
    shift_offset = 0
    if MUTANT == "batch_row_shift":
        # A sequence after the first reads its last key's tile through the row before its own.
        seq_len = tl.sum(tl.where(seqs == seq, lens, 0))
        shift_start = tl.where(seq > 0, (seq_len - 1) // TILE * TILE, -1)
        shift_offset = -stride_table_seq
    for part in tl.static_range(2):
        if part == 0:
            tile_start = start
            num_tiles = num_full
        else:
            tile_start = start + num_full * TILE
            num_tiles = (tile_start < end).to(tl.int32)
        acc, m_i, l_i = _decode_tiles(
            acc, m_i, l_i, q_main, q_rope, tile_start, num_tiles, end,
            k_ptr, v_ptr, k_rows_desc, rope_rows_desc, table_row_ptr, kv_head,
            stride_k_page, stride_k_pos, stride_k_head, stride_v_page, stride_v_pos, stride_v_head,
            scale, logit_cap, shift_start, shift_offset,
            QK_MAIN, QK_MAIN_PAD, QK_ROPE, QK_ROPE_PAD, V_DIM, V_PAD, PAGE_SIZE, TILE, PAGES,
            V_IS_K_MAIN, USE_LOGIT_CAP, PAGE_OFFSET_INT64, part == 1, ROW_TMA, MUTANT,
        )  # fmt: skip

    d_v = tl.arange(0, V_PAD)
    part_rows = partials_ptr + item.to(tl.int64) * stride_p_item + heads * stride_p_head
    result = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(part_rows[:, None] + d_v[None, :], result, mask=head_ok[:, None] & (d_v < V_DIM)[None, :])
    lse = tl.where(l_i > 0.0, (m_i + tl.log2(tl.maximum(l_i, 1e-30))) * 0.6931471805599453, float("-inf"))
    tl.store(part_rows + V_DIM, lse, mask=head_ok)
