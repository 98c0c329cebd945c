"""kernels.unified_attention against the float64 reference, on a cache whose tail is NaN.

On a host without CUDA these run in Triton's interpreter (see conftest); tests marked gpu
repeat them at real sizes on a GPU host.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from kernels._launch import LaunchConfig
from kernels.reference import relative_error, unified_attention_reference
from kernels.unified_attention import unified_attention
from tests.kernels.conftest import (
    DEVICE,
    ON_GPU,
    PagedCache,
    block_table,
    cu_seqlens,
    fill_unwritten,
    nan_like,
    paged_cache,
    randn,
)

DTYPES = [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16]  # the interpreter's bf16 dot is wrong
pytestmark = [pytest.mark.usefixtures("kernel_runtime"), pytest.mark.slow]
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (a GPU host runs scripts/gpu/kernel_tests.sh)")


@dataclass(frozen=True)
class Case:
    name: str
    query_lens: list[int]
    seq_lens: list[int]
    num_heads: int = 4
    num_kv_heads: int = 2
    head_size: int = 64
    block_size: int = 16
    window_left: int = -1
    softcap: float = 0.0
    config: LaunchConfig | None = None
    extra: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("mixed_prefill_decode_gqa", [1, 7, 1, 18], [33, 7, 50, 40]),
    Case("decode_mha_head80_block8", [1, 1, 1], [17, 64, 5], num_heads=2, num_kv_heads=2, head_size=80, block_size=8),
    Case("three_queries_per_kv_block32", [3, 1], [45, 70], num_heads=6, num_kv_heads=2, block_size=32),
    Case("prefill_only", [20, 33], [20, 33]),
    Case("sliding_window", [5, 1, 12], [30, 41, 12], window_left=8),
    Case("softcap", [4, 1], [20, 35], softcap=5.0),
    Case("decode_split_kv", [1, 1, 1], [70, 9, 130], config=LaunchConfig(num_splits=8)),
    Case("decode_split_kv_window", [1, 1], [200, 33], window_left=40, config=LaunchConfig(num_splits=8)),
    # Token-balanced pieces of a ragged decode batch: a key, a tile -1/0/+1, block edges,
    # one long sequence; then the default launch, which splits from 1024 keys on.
    Case("decode_split_ragged", [1] * 7, [1, 31, 32, 33, 400, 5, 64], config=LaunchConfig(num_splits=16)),
    Case("decode_split_default", [1, 1, 1], [1100, 3, 40]),
]


def run_case(case: Case, causal: bool, dtype: torch.dtype, gen: torch.Generator, variant: str = "fixed") -> float:
    """Relative error of one call against the reference; NaN if any output is not finite."""
    cache = paged_cache(gen, case.seq_lens, case.block_size, case.num_kv_heads, case.head_size, dtype)
    return run_on_cache(case, cache, causal, dtype, gen, variant)


def run_on_cache(
    case: Case, cache: PagedCache, causal: bool, dtype: torch.dtype, gen: torch.Generator, variant: str
) -> float:
    q = randn(gen, sum(case.query_lens), case.num_heads, case.head_size, dtype=dtype)
    out = nan_like(q)
    cu = cu_seqlens(case.query_lens)
    scale = case.head_size**-0.5
    window = (case.window_left, 0 if case.window_left >= 0 else -1)
    extra = {"q_descale": None, "k_descale": None, "v_descale": None} | case.extra
    unified_attention(
        q, cache.k, cache.v, out, cu, max(case.query_lens), cache.seq_lens, max(case.seq_lens),
        scale, causal, window, cache.block_table, case.softcap,
        **extra, variant=variant, config=case.config,
    )  # fmt: skip
    expected = unified_attention_reference(
        q, cache.k, cache.v, cu, cache.seq_lens, cache.block_table, scale, causal, window, case.softcap
    )
    return relative_error(out, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference_with_nan_tail(case: Case, causal: bool, dtype: torch.dtype, gen: torch.Generator) -> None:
    assert run_case(case, causal, dtype, gen) < 1e-2


@pytest.mark.parametrize("case", [*[c for c in CASES if c.window_left < 0][:3], CASES[-2]], ids=lambda c: c.name)
def test_legacy_is_right_when_causal(case: Case, gen: torch.Generator) -> None:
    """Causal bounds never passed seq_len: the legacy twin differs only where the bug was."""
    assert run_case(case, True, torch.float16, gen, variant="legacy") < 1e-2


CROSS_ATTENTION = [
    Case("cross_attention_mha", [1, 1, 2, 1], [15, 37, 20, 8], num_heads=4, num_kv_heads=4),
    Case("cross_attention_gqa", [1, 3], [29, 16], num_heads=8, num_kv_heads=2),
    Case("cross_attention_split_kv", [1, 1], [45, 19], num_heads=4, num_kv_heads=4, config=LaunchConfig(num_splits=6)),
]


@pytest.mark.parametrize("case", CROSS_ATTENTION, ids=lambda c: c.name)
def test_nan_tail_poisons_legacy_noncausal_only(case: Case, gen: torch.Generator) -> None:
    """Non-causal attention over NaN block tails (Whisper cross-attention): the fix stays
    finite and right; the legacy twin reads the tail and every sequence turns non-finite."""
    assert run_case(case, False, torch.float16, gen) < 1e-2
    cache = paged_cache(gen, case.seq_lens, case.block_size, case.num_kv_heads, case.head_size, torch.float16)
    q = randn(gen, sum(case.query_lens), case.num_heads, case.head_size, dtype=torch.float16)
    out = nan_like(q)
    cu = cu_seqlens(case.query_lens)
    unified_attention(
        q, cache.k, cache.v, out, cu, max(case.query_lens), cache.seq_lens, max(case.seq_lens),
        case.head_size**-0.5, False, (-1, -1), cache.block_table, 0.0, None, None, None,
        variant="legacy", config=case.config,
    )  # fmt: skip
    starts = cu.tolist()
    poisoned = [not torch.isfinite(out[starts[i] : starts[i + 1]]).all() for i in range(len(case.seq_lens))]
    assert all(poisoned)


@pytest.mark.parametrize("variant", ["fixed", "legacy"])
def test_block_ids_past_int32_offsets(
    huge_buffer: Callable[[int, torch.dtype], torch.Tensor], variant: str, gen: torch.Generator
) -> None:
    """Block ids whose offsets pass 2^31 elements: the unified kernel indexes blocks in
    int64 in both variants (it never had the decode kernel's wrap)."""
    case = Case("huge_block_ids", [1, 3], [20, 40])
    block_elements = 2 * case.block_size * case.num_kv_heads * case.head_size
    first = 2**31 // block_elements + 1
    pages = [[3, first], [first + 5, first + 1, 7]]
    num_blocks = first + 6
    kv = huge_buffer(num_blocks * block_elements, torch.float16).view(
        num_blocks, 2, case.block_size, case.num_kv_heads, -1
    )
    for page in {p for ids in pages for p in ids}:
        kv[page] = randn(gen, *kv.shape[1:], dtype=torch.float16)
    k, v = kv.unbind(1)
    fill_unwritten([k, v], pages, case.seq_lens)
    lens = torch.tensor(case.seq_lens, dtype=torch.int32, device=DEVICE)
    cache = PagedCache(k=k, v=v, block_table=block_table(pages), seq_lens=lens)
    assert run_on_cache(case, cache, True, torch.float16, gen, variant) < 1e-2


def _tensor() -> torch.Tensor:
    return torch.ones(4, device=DEVICE)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"alibi_slopes": _tensor}, NotImplementedError, "alibi_slopes"),
        ({"sinks": _tensor}, NotImplementedError, "sinks"),
        ({"qq_bias": _tensor}, NotImplementedError, "qq_bias"),
        ({"mm_prefix_range": _tensor}, NotImplementedError, "mm_prefix_range"),
        ({"output_scale": _tensor}, NotImplementedError, "output_scale"),
        ({"rswa_window": lambda: 64}, NotImplementedError, "rswa_window"),
        ({"use_alibi_sqrt": lambda: True}, NotImplementedError, "use_alibi_sqrt"),
        ({"kv_quant_mode": lambda: 1}, NotImplementedError, "kv_quant_mode"),
        ({"k_scale_cache": _tensor}, NotImplementedError, "k_scale_cache"),
        ({"chunk_lookback": lambda: 2}, NotImplementedError, "chunk_lookback"),
        ({"causal": lambda: torch.ones(2, dtype=torch.bool)}, NotImplementedError, "per-sequence causal"),
        ({"q_descale": _tensor}, NotImplementedError, "q_descale"),
        ({"variant": lambda: "stock"}, ValueError, "variant"),
        ({"config": lambda: LaunchConfig(num_splits=70000)}, ValueError, "more than the 65535"),  # grid axis
        ({"k": lambda: torch.zeros(4, 16, 2, 64, dtype=torch.float8_e4m3fn)}, NotImplementedError, "fp8"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_refuses_what_it_does_not_implement(kwargs: dict[str, Any], error: type[Exception], name: str) -> None:
    args: dict[str, Any] = dict(
        q=torch.zeros(2, 4, 64, dtype=torch.float16),
        k=torch.zeros(4, 16, 2, 64, dtype=torch.float16),
        v=torch.zeros(4, 16, 2, 64, dtype=torch.float16),
        out=torch.zeros(2, 4, 64, dtype=torch.float16),
        cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32),
        max_seqlen_q=1,
        seqused_k=torch.tensor([5, 9], dtype=torch.int32),
        max_seqlen_k=9,
        softmax_scale=0.125,
        causal=True,
        window_size=(-1, -1),
        block_table=torch.zeros(2, 1, dtype=torch.int32),
        softcap=0.0,
        q_descale=None,
        k_descale=None,
        v_descale=None,
    )
    args.update({key: make() for key, make in kwargs.items()})
    with pytest.raises(error, match=name):
        unified_attention(**args)


def test_accepts_vllm_extras_that_do_not_change_the_result(gen: torch.Generator) -> None:
    """What vLLM 0.24/0.25 pass on a plain bf16/fp16 cache: 3D scratch, unit descales, use_td."""
    scratch = torch.empty(4, 4, 16, 64, device=DEVICE)
    case = Case(
        "vllm_extras",
        [1, 1],
        [40, 23],
        extra={
            "k_descale": torch.ones(2, 2, device=DEVICE),
            "v_descale": torch.ones(2, 2, device=DEVICE),
            "seq_threshold_3D": 4,
            "num_par_softmax_segments": 16,
            "softmax_segm_output": scratch,
            "softmax_segm_max": scratch[..., 0],
            "softmax_segm_expsum": scratch[..., 0],
            "use_td": True,
            "mm_prefix_clamp_sliding_window": True,
        },
    )
    assert run_case(case, True, torch.float16, gen) < 1e-2


# GPU host: the same checks at real sizes.
WHISPER_CROSS = Case("whisper_cross_1500", [1] * 12 + [3] * 4, [1500] * 16, num_heads=20, num_kv_heads=20)
GQA_DECODE = Case(
    "gqa_decode_8k", [1] * 8, [8192 - 3 * i for i in range(8)], num_heads=32, num_kv_heads=8, head_size=128
)
LONG_PREFILL = Case("mixed_prefill_2k", [1, 700, 1, 1500], [3000, 2100, 513, 1500], num_heads=32, num_kv_heads=8)
WINDOW_SOFTCAP = Case(
    "window_softcap", [1, 300, 1], [5000, 2000, 1500], num_heads=16, num_kv_heads=8, window_left=1023, softcap=30.0
)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("case", [WHISPER_CROSS, GQA_DECODE, LONG_PREFILL, WINDOW_SOFTCAP], ids=lambda c: c.name)
def test_real_sizes_match_reference(case: Case, causal: bool, gen: torch.Generator) -> None:
    assert run_case(case, causal, torch.bfloat16, gen) < 1e-2


@pytest.mark.gpu
@needs_gpu
def test_real_size_cross_attention_nan_tail(gen: torch.Generator) -> None:
    test_nan_tail_poisons_legacy_noncausal_only(WHISPER_CROSS, gen)
    assert run_case(WHISPER_CROSS, True, torch.bfloat16, gen, variant="legacy") < 1e-2


@pytest.mark.gpu
@needs_gpu
def test_cuda_graph_replay_follows_new_seq_lens(gen: torch.Generator) -> None:
    """A decode-only batch captured once and replayed with other length mixes in the same
    tensors: the split pieces follow each replay's seqused_k."""
    longest, batch = 8192, 16
    case = Case("gqa_graph", [1] * batch, [longest] * batch, num_heads=32, num_kv_heads=8, head_size=128)
    cache = paged_cache(gen, case.seq_lens, case.block_size, case.num_kv_heads, case.head_size, torch.bfloat16)
    q = randn(gen, batch, case.num_heads, case.head_size, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    cu = cu_seqlens(case.query_lens)
    scale = case.head_size**-0.5

    def call() -> None:
        unified_attention(
            q, cache.k, cache.v, out, cu, 1, cache.seq_lens, longest, scale, True, (-1, -1), cache.block_table,
            0.0, None, None, None,
        )  # fmt: skip

    call()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for mix in ([longest] * batch, [1] * (batch - 1) + [longest], [2, 3, 64, 65, 4000, 129, 7000, 1] * 2):
        cache.seq_lens.copy_(torch.tensor(mix, dtype=torch.int32))
        q.copy_(randn(gen, *q.shape, dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        expected = unified_attention_reference(q, cache.k, cache.v, cu, cache.seq_lens, cache.block_table, scale, True)
        assert relative_error(out, expected) < 1e-2, mix
