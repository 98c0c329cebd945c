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
batch_row_shift, split_lse_merge, split_lse_base2, window_edge_leak, softmax_scale_drift)
are ``MUTANT`` switches that the fixed variant leaves off, so its compiled code does not change.
A generated mutant's id runs the same entry point of its own rebuilt modules.
"""

import torch
import triton

from kernels import generated_mutants, mutants
from kernels._launch import Launch, LaunchConfig, sm_count
from kernels._split_kv import merge_splits, schedule_lanes, split_scratch, work_items
from kernels._unified_kernel import _unified_attention_kernel
from kernels._vllm_args import check_unified_layout, refuse_unsupported_unified

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
    if variant in mutants.GENERATED:  # its own modules, built from the sources (kernels.generated_mutants)
        generated_mutants.launcher(variant, mutants.UNIFIED)(**{**locals(), "variant": "fixed"})
        return
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
