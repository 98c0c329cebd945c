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
carries (``kernels.mutants``: batch_row_shift, split_lse_merge, split_lse_base2,
softmax_scale_drift) are ``MUTANT`` switches that the fixed variant leaves off, so its compiled code does not change.
A generated mutant's id runs the same entry point of its own rebuilt modules.
"""

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import generated_mutants, mutants
from kernels._decode_kernel import _decode_split_kernel
from kernels._launch import Launch, LaunchConfig, has_tma, sm_count
from kernels._split_kv import merge_splits, schedule_lanes, split_scratch, work_items
from kernels._vllm_args import check_decode_args, check_unit_scale, page_geometry

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
    if variant in mutants.GENERATED:  # its own modules, built from the sources (kernels.generated_mutants)
        generated_mutants.launcher(variant, mutants.DECODE)(**{**locals(), "variant": "fixed"})
        return
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
