# mypy: disable-error-code="no-untyped-def"
# Triton reads a kernel parameter's annotation as its type (tl.constexpr, tl.int64), so the
# @triton.jit functions leave tensors and scalars unannotated.
"""Split-KV decode attention (flash-decoding) over a paged KV cache: MHA, GQA and MLA.

The entry point has the argument names and order of vLLM's
``vllm.v1.attention.ops.triton_decode_attention.decode_attention_fwd``, the function vLLM's
TRITON_MLA backend calls. Stage 1 runs one program per (sequence, head group, key split)
and writes the split's normalised output and log-sum-exp into ``attn_logits``; stage 2
merges the splits by their log-sum-exp.

The fix (vLLM PR #47671): every offset built from a page number is int64. With MLA
(576-wide keys) and 480-token pages a page spans 276,480 elements, so page ids past 7,767
overflow int32 and wrap negative. ``variant="legacy"`` keeps the int32 offsets to prove
that tests catch the wrap.
"""

import torch
import triton
import triton.language as tl

from kernels._launch import Launch, LaunchConfig, check_variant, sm_count
from kernels._split_kv import merge_splits
from kernels._vllm_args import check_decode_args, check_unit_scale, page_geometry


@triton.jit
def _tile_ptrs(base_ptr, page, stride_page, row_offs, cols, PAGE_OFFSET_INT64: tl.constexpr, ONE_PAGE: tl.constexpr):
    """Pointers ``base + page * stride_page + row_offs[:, None] + cols[None, :]``, where
    ``page`` is a scalar (ONE_PAGE) or one page id per row. Only the page product needs
    int64; the in-page offsets stay int32 and are added to the page's base pointer."""
    offs = row_offs[:, None] + cols[None, :]
    if not ONE_PAGE:
        page = page[:, None]
    if PAGE_OFFSET_INT64:
        ptrs = (base_ptr + page.to(tl.int64) * stride_page) + offs
    else:
        # Pre-fix arithmetic: the whole offset in int32, which wraps past 2^31 elements.
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
    QK_MAIN: tl.constexpr,
    QK_MAIN_PAD: tl.constexpr,
    QK_ROPE: tl.constexpr,
    QK_ROPE_PAD: tl.constexpr,
    V_DIM: tl.constexpr,
    V_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    TILE_IN_ONE_PAGE: tl.constexpr,
    V_IS_K_MAIN: tl.constexpr,
    USE_LOGIT_CAP: tl.constexpr,
    PAGE_OFFSET_INT64: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Online-softmax accumulation over ``num_tiles`` tiles of TILE keys from ``start``.

    Only the MASKED call (the sequence's last, partial tile) masks loads at ``end``. When
    tiles never straddle a page (TILE_IN_ONE_PAGE), a tile's page id is one scalar: one
    table load and one int64 product per tile instead of one per key.
    """
    offs_n = tl.arange(0, TILE)
    d_main = tl.arange(0, QK_MAIN_PAD)
    d_v = tl.arange(0, V_PAD)
    for t in tl.range(0, num_tiles):
        pos = start + t * TILE + offs_n
        in_seq = pos < end
        if TILE_IN_ONE_PAGE:
            page = tl.load(table_row_ptr + (start + t * TILE) // PAGE_SIZE)
        elif MASKED:
            page = tl.load(table_row_ptr + pos // PAGE_SIZE, mask=in_seq, other=0)
        else:
            page = tl.load(table_row_ptr + pos // PAGE_SIZE)
        k_rows = (pos % PAGE_SIZE) * stride_k_pos + kv_head * stride_k_head
        k_ptrs = _tile_ptrs(k_ptr, page, stride_k_page, k_rows, d_main, PAGE_OFFSET_INT64, TILE_IN_ONE_PAGE)
        if MASKED or QK_MAIN != QK_MAIN_PAD:
            k_main = tl.load(k_ptrs, mask=in_seq[:, None] & (d_main < QK_MAIN)[None, :], other=0.0)
        else:
            k_main = tl.load(k_ptrs)
        s = tl.dot(q_main, tl.trans(k_main))
        if QK_ROPE > 0:
            d_rope = tl.arange(0, QK_ROPE_PAD)
            rope_ptrs = _tile_ptrs(
                k_ptr, page, stride_k_page, k_rows, QK_MAIN + d_rope, PAGE_OFFSET_INT64, TILE_IN_ONE_PAGE
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
            v_ptrs = _tile_ptrs(v_ptr, page, stride_v_page, v_rows, d_v, PAGE_OFFSET_INT64, TILE_IN_ONE_PAGE)
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


@triton.jit(do_not_specialize=["num_splits"])
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    seq_lens_ptr,
    partials_ptr,
    scale,
    logit_cap,
    num_splits,
    stride_q_tok,
    stride_q_head,
    stride_k_page,
    stride_k_pos,
    stride_k_head,
    stride_v_page,
    stride_v_pos,
    stride_v_head,
    stride_table_seq,
    stride_p_tok,
    stride_p_head,
    stride_p_split,
    NUM_Q_HEADS: tl.constexpr,
    Q_PER_KV: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    QK_MAIN: tl.constexpr,
    QK_MAIN_PAD: tl.constexpr,
    QK_ROPE: tl.constexpr,
    QK_ROPE_PAD: tl.constexpr,
    V_DIM: tl.constexpr,
    V_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    TILE_IN_ONE_PAGE: tl.constexpr,
    V_IS_K_MAIN: tl.constexpr,
    USE_LOGIT_CAP: tl.constexpr,
    PAGE_OFFSET_INT64: tl.constexpr,
):
    seq = tl.program_id(0)
    first_head = tl.program_id(1) * HEADS_PER_PROGRAM
    split = tl.program_id(2)
    kv_head = first_head // Q_PER_KV
    rows = tl.arange(0, BLOCK_H)
    heads = first_head + rows
    head_ok = (rows < HEADS_PER_PROGRAM) & (heads < NUM_Q_HEADS)

    q_rows = q_ptr + seq.to(tl.int64) * stride_q_tok + heads * stride_q_head
    d_main = tl.arange(0, QK_MAIN_PAD)
    q_main = tl.load(q_rows[:, None] + d_main[None, :], mask=head_ok[:, None] & (d_main < QK_MAIN)[None, :], other=0.0)
    q_rope = q_main
    if QK_ROPE > 0:
        d_rope = tl.arange(0, QK_ROPE_PAD)
        rope_mask = head_ok[:, None] & (d_rope < QK_ROPE)[None, :]
        q_rope = tl.load(q_rows[:, None] + QK_MAIN + d_rope[None, :], mask=rope_mask, other=0.0)

    # Splits are whole tiles, so only the sequence's last tile is partial and masked.
    seq_len = tl.load(seq_lens_ptr + seq)
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), TILE) * TILE
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    num_full = tl.maximum(end - start, 0) // TILE

    acc = tl.zeros([BLOCK_H, V_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    table_row_ptr = table_ptr + seq.to(tl.int64) * stride_table_seq
    for part in tl.static_range(2):
        if part == 0:
            tile_start = start
            num_tiles = num_full
        else:
            tile_start = start + num_full * TILE
            num_tiles = (tile_start < end).to(tl.int32)
        acc, m_i, l_i = _decode_tiles(
            acc, m_i, l_i, q_main, q_rope, tile_start, num_tiles, end,
            k_ptr, v_ptr, table_row_ptr, kv_head,
            stride_k_page, stride_k_pos, stride_k_head, stride_v_page, stride_v_pos, stride_v_head,
            scale, logit_cap,
            QK_MAIN, QK_MAIN_PAD, QK_ROPE, QK_ROPE_PAD, V_DIM, V_PAD, PAGE_SIZE, TILE, TILE_IN_ONE_PAGE,
            V_IS_K_MAIN, USE_LOGIT_CAP, PAGE_OFFSET_INT64, part == 1,
        )  # fmt: skip

    d_v = tl.arange(0, V_PAD)
    part_rows = partials_ptr + seq.to(tl.int64) * stride_p_tok + heads * stride_p_head + split * stride_p_split
    result = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(part_rows[:, None] + d_v[None, :], result, mask=head_ok[:, None] & (d_v < V_DIM)[None, :])
    lse = tl.where(l_i > 0.0, (m_i + tl.log2(tl.maximum(l_i, 1e-30))) * 0.6931471805599453, float("-inf"))
    tl.store(part_rows + V_DIM, lse, mask=head_ok)


# An MLA program (16 heads, 64 keys of 576 a tile, 8 warps) keeps about 2 resident per
# multiprocessor: split the keys so that one wave fills them. Rounding down keeps a second,
# mostly idle wave away; fewer splits also mean less partial traffic for stage 2. Tiles that
# divide the page size let a tile's page id be one scalar.
_PROGRAMS_PER_SM = 2
_BLOCK_H = 16


def _default_launch(is_mla: bool, programs_per_split: int, num_sms: int, page_size: int) -> Launch:
    splits = max(1, _PROGRAMS_PER_SM * num_sms // programs_per_split)
    if page_size % 64 == 0:
        return Launch(tile=64, num_warps=8 if is_mla else 4, num_stages=2, num_splits=splits)
    return Launch(tile=32, num_warps=8 if is_mla else 4, num_stages=3 if is_mla else 2, num_splits=splits)


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
    ``attn_logits [batch, heads, num_kv_splits, Lv + 1]`` is the split scratch; fewer
    splits than ``num_kv_splits`` may be used. ``lse`` receives the natural-log
    log-sum-exp of the scaled (and capped) scores. ``config`` overrides the launch (benchmarks).
    """
    check_variant("decode_attention_fwd", variant)
    check_decode_args(q, k_buffer, v_buffer, o, attn_logits, num_kv_splits, is_mla)
    check_unit_scale(k_scale, "k_scale")
    check_unit_scale(v_scale, "v_scale")
    k_strides = page_geometry(k_buffer, page_size, "k_buffer")
    v_strides = page_geometry(v_buffer, page_size, "v_buffer")

    batch, num_q_heads, lk = q.shape
    lv = v_buffer.shape[-1]
    q_per_kv = num_q_heads // k_buffer.shape[-2]
    heads_per_program = min(_BLOCK_H, q_per_kv)
    block_h = max(_BLOCK_H, triton.next_power_of_2(heads_per_program))
    head_blocks = triton.cdiv(num_q_heads, heads_per_program)
    qk_main = lv if is_mla else lk
    qk_rope = lk - lv if is_mla else 0
    default = _default_launch(is_mla, batch * head_blocks, sm_count(q.device), page_size)
    launch = (config or LaunchConfig()).resolve(default)
    num_splits = min(launch.num_splits, num_kv_splits)

    _decode_split_kernel[(batch, head_blocks, num_splits)](
        q, k_buffer, v_buffer, req_to_token, b_seq_len, attn_logits,
        sm_scale, logit_cap, num_splits,
        q.stride(0), q.stride(1), *k_strides, *v_strides, req_to_token.stride(0),
        attn_logits.stride(0), attn_logits.stride(1), attn_logits.stride(2),
        NUM_Q_HEADS=num_q_heads,
        Q_PER_KV=q_per_kv,
        HEADS_PER_PROGRAM=heads_per_program,
        BLOCK_H=block_h,
        QK_MAIN=qk_main,
        QK_MAIN_PAD=max(16, triton.next_power_of_2(qk_main)),
        QK_ROPE=qk_rope,
        QK_ROPE_PAD=max(16, triton.next_power_of_2(qk_rope)) if qk_rope else 0,
        V_DIM=lv,
        V_PAD=max(16, triton.next_power_of_2(lv)),
        PAGE_SIZE=page_size,
        TILE=launch.tile,
        TILE_IN_ONE_PAGE=page_size % launch.tile == 0,
        V_IS_K_MAIN=is_mla,
        USE_LOGIT_CAP=logit_cap > 0,
        PAGE_OFFSET_INT64=variant == "fixed",
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )  # fmt: skip
    merge_splits(attn_logits, num_splits, o, lse)
