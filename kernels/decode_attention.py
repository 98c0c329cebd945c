# mypy: disable-error-code="no-untyped-def"
# Triton reads a kernel parameter's annotation as its type (tl.constexpr, tl.int64), so the
# @triton.jit functions leave tensors and scalars unannotated.
"""Split-KV decode attention (flash-decoding) over a paged KV cache: MHA, GQA and MLA.

The entry point has the argument names and order of vLLM's
``vllm.v1.attention.ops.triton_decode_attention.decode_attention_fwd``, the function vLLM's
TRITON_MLA backend calls. Stage 1 runs one program per (head group, work item): the work
items cut the batch's keys into token-balanced pieces, scheduled on the device from
``b_seq_len`` (``kernels._split_kv``); each writes its piece's normalised output and
log-sum-exp, and stage 2 merges a sequence's pieces by their log-sum-exp.

The fix (vLLM PR #47671): every offset built from a page number is int64. With MLA
(576-wide keys) and 480-token pages a page spans 276,480 elements, so page ids past 7,767
overflow int32 and wrap negative. ``variant="legacy"`` (and the mutant ``page_offset_i32``)
keeps the int32 offsets to prove that tests catch the wrap. The other mutants this kernel
carries (``kernels.mutants``: batch_row_shift, split_lse_merge, softmax_scale_drift) are
``MUTANT`` switches that the fixed variant leaves off, so its compiled code does not change.
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import mutants
from kernels._launch import Launch, LaunchConfig, has_tma, sm_count
from kernels._split_kv import balanced_piece, merge_splits, schedule_lanes, split_scratch, work_items
from kernels._vllm_args import check_decode_args, check_unit_scale, page_geometry


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


# Head groups: up to 64 query heads of one KV head per program, so that many-head MLA runs
# its dots on M=64 tiles (Hopper's wgmma size) and reads the latent keys once per 64 heads;
# the [64, 512] fp32 accumulator then takes 128 registers a thread at 8 warps. 64-key tiles
# fill the registers (sm_90 with Triton 3.9: 255 and a 184 B spill stack, 217 KB of shared
# memory, scripts/kernel_resources.py; on the H200 with Triton 3.6, 235 and no spills) and
# were still 1.4x faster than 32-key tiles on an H200 (128 heads, 32 sequences of 1k-8k).
# A 64-head program copies whole tiles with the tensor memory accelerator where tiles divide
# the page (0.91x the time of pointer loads on that H200 row: no per-element addresses in
# its registers). Narrower programs keep pointer loads (TMA was 0.96-1.02x there) and take
# 4 warps: 16-head MLA (64 keys of 576 a tile, 193 registers, 92 KB) was 0.90-0.93x the
# time of 8 warps on the H200 sweep (ragged and uniform, pages of 64 and 480), with the
# same shared memory and so the same 2 programs resident.
# Work items: 2 programs per multiprocessor. A program of up to 32 heads keeps 2 resident,
# so that is one wave: memory-bound, where every extra piece costs a partial written and
# read back (33 KB for 16 heads). A 64-head program keeps 1 resident, so that is two waves:
# compute-bound, where the second wave evens out what the pieces' rounding leaves (a batch
# larger than the target gets half the target more: kernels._split_kv.work_items). The
# schedule cuts the batch's keys into at most that many near-equal pieces whatever the
# length mix; pieces of at least 256 keys keep the partials' traffic small for short
# batches (an explicit num_splits drops that floor). Tiles that divide the page size let a
# tile's page id be one scalar. On 480-token pages 64-key tiles meet at most two pages: two
# scalar page ids a tile (with a page id per key, fixed was 1.37x slower than legacy there
# on the H200).
_MAX_HEADS_PER_PROGRAM = 64
_MIN_PIECE_KEYS = 256
_PROGRAMS_PER_SM = 2


def _default_launch(
    is_mla: bool, heads_per_program: int, num_kv_heads: int, q_per_kv: int, num_sms: int, page_size: int
) -> Launch:
    head_blocks = num_kv_heads * triton.cdiv(q_per_kv, heads_per_program)
    wide = heads_per_program > 32
    items = max(1, _PROGRAMS_PER_SM * num_sms // head_blocks)
    num_warps = 8 if wide else 4
    if wide:
        tile, num_stages = (64 if page_size % 64 == 0 else 32), 2
    elif page_size % 64 == 0:
        tile, num_stages = 64, 2
    elif is_mla and page_size > 64:
        tile, num_stages = 64, 3
    else:
        tile, num_stages = 32, 3 if is_mla else 2
    return Launch(tile, num_warps, num_stages, items, heads_per_program, row_tma=wide)


def _pages_a_tile_meets(page_size: int, tile: int) -> int:
    """1 where tiles divide the page, 2 where a tile shorter than a page can meet two, else 0
    (a page id per key)."""
    if page_size % tile == 0:
        return 1
    return 2 if tile <= page_size else 0


_MAX_TMA_ROWS = 2**31  # the accelerator's coordinates are int32


def _row_descriptors(
    k_buffer: torch.Tensor, page_size: int, stride_pos: int, stride_page: int, lv: int, tile: int
) -> tuple[TensorDescriptor, TensorDescriptor] | None:
    """Descriptors of ``[tile, Lv]`` and ``[tile, Lk - Lv]`` blocks of the single-head MLA
    cache viewed as ``[pages * page_size, Lk]`` rows, or None where it is not such a view or
    the accelerator cannot address it (alignment, 2-byte elements, int32 row indices)."""
    lk = k_buffer.shape[-1]
    rows = k_buffer.shape[0] * (page_size if k_buffer.dim() == 4 else 1)
    aligned = k_buffer.data_ptr() % 16 == 0 and (stride_pos * k_buffer.element_size()) % 16 == 0
    if not (
        0 < rows < _MAX_TMA_ROWS
        and k_buffer.shape[-2] == 1
        and k_buffer.element_size() == 2
        and stride_page == page_size * stride_pos
        and aligned
    ):
        return None
    rope = max(lk - lv, 16)  # unused when there is no rope part, but a block needs a shape
    return (
        TensorDescriptor(k_buffer, [rows, lk], [stride_pos, 1], [tile, lv]),
        TensorDescriptor(k_buffer, [rows, lk], [stride_pos, 1], [tile, rope]),
    )


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    req_to_token: torch.Tensor,
    b_seq_len: torch.Tensor,
    attn_logits: torch.Tensor,
    num_kv_splits: int,
    sm_scale: float,
    page_size: int = 1,
    logit_cap: float = 0.0,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    is_mla: bool = False,
    *,
    variant: str = "fixed",
    config: LaunchConfig | None = None,
) -> None:
    """Decode attention of ``q [batch, heads, Lk]`` over a paged cache into ``o`` and ``lse``.

    ``k_buffer``/``v_buffer`` are ``[pages, page_size, kv_heads, L]`` (or pages packed as
    ``[tokens, kv_heads, L]``); int32 ``req_to_token [batch, max_pages]`` maps each
    sequence's page index to a page id. With ``is_mla`` the values are the first ``Lv``
    key columns (vLLM passes that view as ``v_buffer``) and are read once, with the keys.
    ``attn_logits [batch, heads, num_kv_splits, Lv + 1]`` is checked and left unused (the
    schedule's items need their own scratch). ``lse`` receives the natural-log
    log-sum-exp of the scaled (and capped) scores. ``config`` overrides the launch (benchmarks).
    """
    mutants.check_variant("decode_attention_fwd", variant)
    check_decode_args(q, k_buffer, v_buffer, o, attn_logits, num_kv_splits, is_mla)
    check_unit_scale(k_scale, "k_scale")
    check_unit_scale(v_scale, "v_scale")
    k_strides = page_geometry(k_buffer, page_size, "k_buffer")
    v_strides = page_geometry(v_buffer, page_size, "v_buffer")

    batch, num_q_heads, lk = q.shape
    lv = v_buffer.shape[-1]
    num_kv_heads = k_buffer.shape[-2]
    q_per_kv = num_q_heads // num_kv_heads
    config = config or LaunchConfig()
    heads_per_program = min(config.heads_per_program or _MAX_HEADS_PER_PROGRAM, q_per_kv)
    default = _default_launch(is_mla, heads_per_program, num_kv_heads, q_per_kv, sm_count(q.device), page_size)
    launch = config.resolve(default)._replace(heads_per_program=heads_per_program)
    blocks_per_kv = triton.cdiv(q_per_kv, heads_per_program)
    qk_main = lv if is_mla else lk
    qk_rope = lk - lv if is_mla else 0
    # The grid is fixed by the batch size (CUDA graphs); the pieces follow b_seq_len on the
    # device. attn_logits ([batch, heads, num_kv_splits, Lv + 1]) is too small for a grid
    # that is not a multiple of the batch, so the partials get their own scratch.
    num_items = work_items(launch.num_splits, batch)
    partials, sched = split_scratch(num_items, batch, num_q_heads, lv, q.device)
    pages_a_tile_meets = _pages_a_tile_meets(page_size, launch.tile)
    qk_main_pad = max(16, triton.next_power_of_2(qk_main))
    qk_rope_pad = max(16, triton.next_power_of_2(qk_rope)) if qk_rope else 0
    # Whole MLA tiles as TMA copies (not with int32 page offsets: legacy and page_offset_i32 keep
    # their int32 pointer arithmetic). The row index is formed from the table's int32 page ids.
    page_offset_int64 = not mutants.has(variant, "page_offset_i32")
    mutant = mutants.in_kernel(variant, mutants.DECODE)
    descriptors = None
    if (
        launch.row_tma
        and is_mla
        and page_offset_int64
        and pages_a_tile_meets == 1
        and req_to_token.dtype == torch.int32
        and (qk_main, qk_rope) == (qk_main_pad, qk_rope_pad)
        and has_tma(q.device)
    ):
        descriptors = _row_descriptors(k_buffer, page_size, k_strides[1], k_strides[0], lv, launch.tile)
    k_rows_desc, rope_rows_desc = descriptors or (k_buffer, k_buffer)

    _decode_split_kernel[(num_kv_heads * blocks_per_kv, num_items)](
        q, k_buffer, v_buffer, req_to_token, b_seq_len, partials, sched, k_rows_desc, rope_rows_desc,
        mutants.drifted_scale(sm_scale) if variant == "softmax_scale_drift" else sm_scale,
        logit_cap, batch, num_items, 1 if config.num_splits else triton.cdiv(_MIN_PIECE_KEYS, launch.tile),
        q.stride(0), q.stride(1), *k_strides, *v_strides, req_to_token.stride(0),
        partials.stride(0), partials.stride(1),
        Q_PER_KV=q_per_kv,
        HEADS_PER_PROGRAM=heads_per_program,
        BLOCKS_PER_KV=blocks_per_kv,
        BLOCK_H=max(16, triton.next_power_of_2(heads_per_program)),
        QK_MAIN=qk_main,
        QK_MAIN_PAD=qk_main_pad,
        QK_ROPE=qk_rope,
        QK_ROPE_PAD=qk_rope_pad,
        V_DIM=lv,
        V_PAD=max(16, triton.next_power_of_2(lv)),
        PAGE_SIZE=page_size,
        TILE=launch.tile,
        PAGES=pages_a_tile_meets,
        V_IS_K_MAIN=is_mla,
        USE_LOGIT_CAP=logit_cap > 0,
        PAGE_OFFSET_INT64=page_offset_int64,
        SEQS_PAD=schedule_lanes(batch, wide=heads_per_program > 32),
        ROW_TMA=descriptors is not None,
        MUTANT=mutant,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )  # fmt: skip
    merge_splits(partials, sched, batch, o, lse, mutant=mutant)
