"""kernels.decode_attention_fwd against the float64 reference: MHA, GQA, MLA, ragged batches
under the token-balanced schedule, many-head MLA head groups, and the int32 page-offset wrap
(page ids past 2^31 / page stride).

On a host without CUDA these run in Triton's interpreter (see conftest); tests marked gpu
repeat them at real sizes on a GPU host.
"""

import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kernels import decode_attention
from kernels._launch import LaunchConfig
from kernels.decode_attention import decode_attention_fwd
from kernels.reference import decode_attention_reference, relative_error
from tests.kernels.conftest import (
    DEVICE,
    ON_GPU,
    block_table,
    fill_unwritten,
    randn,
    shuffled_pages,
)

pytestmark = [pytest.mark.usefixtures("kernel_runtime"), pytest.mark.slow]
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (a GPU host runs scripts/gpu/kernel_tests.sh)")

# Kimi-Linear's MLA cache: 480-token pages of 576-wide latents, 276,480 elements a page, so
# page ids from 7,768 on put a page's offset past 2^31.
KIMI_PAGE_SIZE = 480
KIMI_PAGE_STRIDE = KIMI_PAGE_SIZE * 576
FIRST_WRAPPING_PAGE = 2**31 // KIMI_PAGE_STRIDE + 1
assert FIRST_WRAPPING_PAGE == 7768


@dataclass(frozen=True)
class Case:
    name: str
    seq_lens: list[int]
    num_heads: int
    num_kv_heads: int
    lk: int
    lv: int
    page_size: int
    is_mla: bool = False
    num_kv_splits: int = 4
    logit_cap: float = 0.0
    packed: bool = False  # pages packed along the token axis: [tokens, heads, dim]
    config: LaunchConfig | None = None


CASES = [
    Case("mha_page16", [5, 40, 17], 4, 4, 64, 64, 16),
    Case("gqa_page1", [9, 33], 8, 2, 128, 128, 1),
    Case("gqa_page7_packed", [50, 13, 1], 8, 2, 64, 64, 7, packed=True),
    Case("head80_logit_cap", [30, 21], 4, 2, 80, 80, 16, logit_cap=0.5),
    Case("mla_page16", [33, 70], 16, 1, 576, 512, 16, is_mla=True),
    Case("mla_page64_tiles_in_one_page", [150, 64], 16, 1, 576, 512, 64, is_mla=True),
    Case("gqa_page32_tiles_in_one_page", [70, 20], 8, 2, 64, 64, 32, config=LaunchConfig(tile=32)),
    # Tiles shorter than pages they do not divide meet at most two pages: two page ids a tile.
    Case("gqa_page48_two_pages_a_tile", [100, 47, 49], 8, 2, 64, 64, 48),
    Case("mla_page480_two_pages_a_tile", [500, 961, 30], 8, 1, 576, 512, 480, is_mla=True),
    Case(
        "mla_empty_splits",
        [20, 3],
        16,
        1,
        576,
        512,
        16,
        is_mla=True,
        num_kv_splits=8,
        config=LaunchConfig(num_splits=8),
    ),
    Case(
        "mla_one_split_tile64", [90, 65], 16, 1, 576, 512, 32, is_mla=True, config=LaunchConfig(num_splits=1, tile=64)
    ),
]


# Fixed and legacy differ only in the page-offset arithmetic, tested above and below.
SCHEDULED_CASES = [
    # Ragged batches (token-balanced pieces): empty, one key, a tile -1/0/+1, page edges,
    # one long sequence beside short ones.
    Case("mla_ragged_page64", [0, 1, 63, 64, 65, 128, 129, 700, 5], 16, 1, 576, 512, 64, is_mla=True),
    Case("mla_ragged_page480", [1500, 3, 0, 31, 32, 33, 480, 481], 8, 1, 576, 512, 480, is_mla=True),
    Case("gqa_ragged_page16", [0, 15, 16, 17, 31, 32, 33, 600, 2], 8, 2, 64, 64, 16),
    # Many-head MLA: 64 heads in one M=64 group, 128 in two groups per KV head; an uneven
    # group (6 query heads per KV head, 4 a program).
    Case("mla_64_heads", [40, 0, 70], 64, 1, 576, 512, 16, is_mla=True),
    Case("mla_128_heads", [40, 0, 70], 128, 1, 576, 512, 16, is_mla=True),
    Case("mla_128_heads_by_32", [33], 128, 1, 576, 512, 16, is_mla=True, config=LaunchConfig(heads_per_program=32)),
    Case("gqa_uneven_head_groups", [50, 20], 12, 2, 64, 64, 16, config=LaunchConfig(heads_per_program=4)),
    # Whole tiles as TMA copies (64-head groups on pages the tiles divide, or asked for): the
    # last, partial tile of each sequence still comes through masked pointer loads.
    Case("mla_128_heads_page64_tma", [130, 0, 64, 65, 1], 128, 1, 576, 512, 64, is_mla=True),
    # Two tiles a page: the copy's row is the page's first row plus the tile's offset in it.
    Case("mla_64_heads_page128_tma", [130, 200, 64, 1], 64, 1, 576, 512, 128, is_mla=True),
    Case("mla_64_heads_page128_tma_packed", [130, 200, 64, 1], 64, 1, 576, 512, 128, is_mla=True, packed=True),
    Case(
        "mla_16_heads_page64_tma",
        [0, 1, 63, 64, 65, 129, 700],
        16,
        1,
        576,
        512,
        64,
        is_mla=True,
        config=LaunchConfig(row_tma=True),
    ),
]


def make_cache(
    case: Case, dtype: torch.dtype, gen: torch.Generator, pages: list[list[int]], num_pages: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """k/v buffers in the layout vLLM hands the kernel; with MLA, v is k's leading columns."""
    k = randn(gen, num_pages, case.page_size, case.num_kv_heads, case.lk, dtype=dtype)
    v = k[..., : case.lv] if case.is_mla else randn(gen, *k.shape[:-1], case.lv, dtype=dtype)
    fill_unwritten([k] if case.is_mla else [k, v], pages, case.seq_lens)
    if case.packed:
        packed = k.flatten(0, 1)
        return packed, packed[..., : case.lv] if case.is_mla else v.flatten(0, 1)
    return k, v


def run(
    case: Case,
    k: torch.Tensor,
    v: torch.Tensor,
    table: torch.Tensor,
    dtype: torch.dtype,
    gen: torch.Generator,
    variant: str,
) -> tuple[float, float]:
    """Relative errors of (o, lse) against the reference, from outputs poisoned with NaN."""
    batch = len(case.seq_lens)
    q = randn(gen, batch, case.num_heads, case.lk, dtype=dtype)
    o = torch.full((batch, case.num_heads, case.lv), float("nan"), dtype=dtype, device=DEVICE)
    lse = torch.full((batch, case.num_heads), float("nan"), device=DEVICE)
    logits = torch.full((batch, case.num_heads, case.num_kv_splits, case.lv + 1), float("nan"), device=DEVICE)
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int32, device=DEVICE)
    scale = case.lk**-0.5
    decode_attention_fwd(
        q, k, v, o, lse, table, seq_lens, logits, case.num_kv_splits, scale, case.page_size, case.logit_cap,
        None, None, case.is_mla, variant=variant, config=case.config,
    )  # fmt: skip
    ref_o, ref_lse = decode_attention_reference(q, k, v, table, seq_lens, scale, case.page_size, case.logit_cap)
    # An empty sequence: a zero output and lse = -inf, as the reference (and vLLM's kernel).
    empty = seq_lens == 0
    assert (o[empty] == 0).all() and (lse[empty] == float("-inf")).all()
    return relative_error(o[~empty], ref_o[~empty]), relative_error(lse[~empty], ref_lse[~empty])


@pytest.mark.parametrize("variant", ["fixed", "legacy"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference_with_nan_tail(case: Case, variant: str, gen: torch.Generator) -> None:
    """Small page ids: both variants are right, whatever the unwritten tail holds."""
    pages, num_pages = shuffled_pages(gen, case.seq_lens, case.page_size)
    k, v = make_cache(case, torch.float16, gen, pages, num_pages)
    err_o, err_lse = run(case, k, v, block_table(pages), torch.float16, gen, variant)
    assert err_o < 1e-2
    assert err_lse < 1e-3


SCHEDULE_CASE = Case("gqa_schedule", [0, 1, 31, 32, 33, 64, 65, 300, 7], 4, 1, 64, 64, 16, logit_cap=0.0)


@pytest.mark.parametrize("num_splits", [1, 3, 9, 64])
def test_every_key_counted_once_whatever_the_items(num_splits: int, gen: torch.Generator) -> None:
    """One piece per sequence up to one tile per piece (tile 16 on 16-token pages): the
    output and lse stay on the float64 reference at a tolerance that a key missed or
    counted twice (1/300 of a sequence's weight or more) would break."""
    case = Case(**{**SCHEDULE_CASE.__dict__, "config": LaunchConfig(num_splits=num_splits, tile=16)})
    pages, num_pages = shuffled_pages(gen, case.seq_lens, case.page_size)
    k, v = make_cache(case, torch.float16, gen, pages, num_pages)
    err_o, err_lse = run(case, k, v, block_table(pages), torch.float16, gen, "fixed")
    assert err_o < 2e-3
    assert err_lse < 1e-5


@pytest.mark.parametrize("case", SCHEDULED_CASES, ids=lambda c: c.name)
def test_ragged_and_many_head_batches(case: Case, gen: torch.Generator) -> None:
    pages, num_pages = shuffled_pages(gen, case.seq_lens, case.page_size)
    k, v = make_cache(case, torch.float16, gen, pages, num_pages)
    err_o, err_lse = run(case, k, v, block_table(pages), torch.float16, gen, "fixed")
    assert err_o < 1e-2
    assert err_lse < 1e-3


def sparse_mla_cache(
    case: Case, dtype: torch.dtype, gen: torch.Generator, pages: list[list[int]], buffer: torch.Tensor, offset: int
) -> torch.Tensor:
    """The case's single-head MLA cache viewed at element ``offset`` of ``buffer`` (pages of
    ``page_size`` rows of ``lk``); only the pages in ``pages`` are written."""
    num_pages = max(max(ids) for ids in pages) + 1
    shape = (case.page_size, 1, case.lk)
    k = buffer[offset : offset + num_pages * case.page_size * case.lk].view(num_pages, *shape)
    for ids in pages:
        for page in ids:
            k[page] = randn(gen, *shape, dtype=dtype)
    fill_unwritten([k], pages, case.seq_lens)
    return k


KIMI_SMALL = Case("kimi_mla_small", [700, 1000], 16, 1, 576, 512, KIMI_PAGE_SIZE, is_mla=True)
KIMI_SMALL_PAGES = [[5, FIRST_WRAPPING_PAGE], [FIRST_WRAPPING_PAGE - 1, 9000, 15000]]


def test_page_offsets_past_int32(huge_buffer: Callable[[int, torch.dtype], torch.Tensor], gen: torch.Generator) -> None:
    """Page ids 7,767 to 15,000 with Kimi's 276,480-element pages: the fixed kernel reads
    them right; the legacy twin's int32 offsets wrap 4 Gi elements back and read other
    memory. The buffer starts 2^31 elements before the cache so that wrapped reads land in
    it (on a GPU they would fault and take the process down)."""
    offset = 2**31
    num_elements = offset + (max(map(max, KIMI_SMALL_PAGES)) + 1) * KIMI_PAGE_STRIDE
    buffer = huge_buffer(num_elements, torch.float16)
    k = sparse_mla_cache(KIMI_SMALL, torch.float16, gen, KIMI_SMALL_PAGES, buffer, offset)
    table = block_table(KIMI_SMALL_PAGES)
    err_fixed, _ = run(KIMI_SMALL, k, k[..., :512], table, torch.float16, gen, "fixed")
    err_legacy, _ = run(KIMI_SMALL, k, k[..., :512], table, torch.float16, gen, "legacy")
    assert err_fixed < 1e-2
    assert not err_legacy < 0.1  # NaN (non-finite) counts as wrong too


def test_tma_rows_past_int32_elements(
    huge_buffer: Callable[[int, torch.dtype], torch.Tensor], gen: torch.Generator
) -> None:
    """A 64-head group on 64-token pages copies whole tiles by row index (page id x 64, int32)
    and lets the accelerator form the byte offset: page ids past 2^31 / 36,864 elements (a
    64-token page of 576-wide latents), where int32 element offsets wrap, read right; the
    legacy twin's int32 pointers on the same pages do not (the buffer starts 2^31 elements
    before the cache, so that its wrapped reads land in it)."""
    case = Case("tma_past_int32", [130, 70], 64, 1, 576, 512, 64, is_mla=True)
    stride = 64 * 576
    first_wrapping = 2**31 // stride + 1
    pages = [[3, first_wrapping, first_wrapping + 7], [first_wrapping - 1, first_wrapping + 2]]
    offset = 2**31
    buffer = huge_buffer(offset + (max(map(max, pages)) + 1) * stride, torch.float16)
    k = sparse_mla_cache(case, torch.float16, gen, pages, buffer, offset)
    assert decode_attention._row_descriptors(k, 64, 576, stride, 512, 64) is not None
    err_o, err_lse = run(case, k, k[..., :512], block_table(pages), torch.float16, gen, "fixed")
    err_legacy, _ = run(case, k, k[..., :512], block_table(pages), torch.float16, gen, "legacy")
    assert err_o < 1e-2
    assert err_lse < 1e-3
    assert not err_legacy < 0.1  # NaN (non-finite) counts as wrong too


def test_tma_copies_run_where_the_launch_allows_them(monkeypatch: pytest.MonkeyPatch, gen: torch.Generator) -> None:
    """Pointer loads give the same numbers, so a launch that silently fell back would pass
    every other test: TMA copies run for a 64-head group of ``fixed`` on pages the tiles
    divide with vLLM's int32 table, and not for ``legacy``, an int64 table or (by default)
    16-head groups, which all still match the reference."""
    made: list[bool] = []
    real = decode_attention._row_descriptors

    def spy(*args: object) -> object:
        descriptors = real(*args)  # type: ignore[arg-type]
        made.append(descriptors is not None)
        return descriptors

    monkeypatch.setattr(decode_attention, "_row_descriptors", spy)
    for heads, variant, table_dtype, expected in [
        (64, "fixed", torch.int32, [True]),
        (64, "legacy", torch.int32, []),
        (64, "fixed", torch.int64, []),
        (16, "fixed", torch.int32, []),
    ]:
        case = Case("tma_or_not", [130, 70], heads, 1, 576, 512, 64, is_mla=True)
        pages, num_pages = shuffled_pages(gen, case.seq_lens, case.page_size)
        k, v = make_cache(case, torch.float16, gen, pages, num_pages)
        made.clear()
        err_o, _ = run(case, k, v, block_table(pages).to(table_dtype), torch.float16, gen, variant)
        assert made == expected, (heads, variant, table_dtype)
        assert err_o < 1e-2


def test_tma_only_where_the_accelerator_can_address_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Descriptors for a single-head, 2-byte, 16-byte-aligned cache of rows; None (pointer
    loads) for several KV heads, 4-byte elements, a misaligned view, pages that are not
    whole rows apart, or more rows than int32 coordinates reach."""
    cache = torch.zeros(6, 64, 1, 576, dtype=torch.float16, device=DEVICE)
    rows = decode_attention._row_descriptors
    assert rows(cache, 64, 576, 64 * 576, 512, 64) is not None
    assert rows(cache.flatten(0, 1), 64, 576, 64 * 576, 512, 64) is not None  # pages packed as tokens
    assert rows(torch.zeros(6, 64, 2, 576, dtype=torch.float16, device=DEVICE), 64, 1152, 64 * 1152, 512, 64) is None
    assert rows(cache.float(), 64, 576, 64 * 576, 512, 64) is None
    shifted = cache.flatten()[4:][: 5 * 64 * 576].view(5, 64, 1, 576)  # 8 bytes off
    assert rows(shifted, 64, 576, 64 * 576, 512, 64) is None
    assert rows(cache, 64, 576, 64 * 576 + 576, 512, 64) is None
    assert rows(cache[:0], 64, 576, 64 * 576, 512, 64) is None  # an empty cache
    monkeypatch.setattr(decode_attention, "_MAX_TMA_ROWS", 6 * 64)
    assert rows(cache, 64, 576, 64 * 576, 512, 64) is None


def test_refuses_what_it_does_not_implement() -> None:
    q = torch.zeros(1, 4, 64, dtype=torch.float16)
    k = torch.zeros(2, 16, 4, 64, dtype=torch.float16)
    v = torch.zeros(2, 16, 4, 64, dtype=torch.float16)
    tail = (torch.zeros(1, 4), torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    logits = torch.zeros(1, 4, 2, 65)
    with pytest.raises(ValueError, match="variant"):
        decode_attention_fwd(q, k, v, q.clone(), *tail, logits, 2, 0.1, 16, variant="stock")
    with pytest.raises(NotImplementedError, match="k_scale"):
        decode_attention_fwd(q, k, v, q.clone(), *tail, logits, 2, 0.1, 16, k_scale=0.5)
    with pytest.raises(NotImplementedError, match="fp8"):
        decode_attention_fwd(q, k.to(torch.float8_e4m3fn), v, q.clone(), *tail, logits, 2, 0.1, 16)
    with pytest.raises(ValueError, match="attn_logits"):
        decode_attention_fwd(q, k, v, q.clone(), *tail, logits, 3, 0.1, 16)
    with pytest.raises(ValueError, match="is_mla"):
        decode_attention_fwd(q, k, v, q.clone(), *tail, logits, 2, 0.1, 16, is_mla=True)
    with pytest.raises(ValueError, match="more than the 65535"):  # the grid's second axis
        decode_attention_fwd(q, k, v, q.clone(), *tail, logits, 2, 0.1, 16, config=LaunchConfig(num_splits=70000))


# GPU host: real sizes.
KIMI_REAL = Case(
    "kimi_mla_real", [7000, 5000, 2400, 8100], 16, 1, 576, 512, KIMI_PAGE_SIZE, is_mla=True, num_kv_splits=16
)
GQA_REAL = Case("gqa_real", [8192 - 7 * i for i in range(16)], 32, 8, 128, 128, 16, num_kv_splits=16)
MLA_REAL = Case("mla_page64_8k", [8192 - 5 * i for i in range(32)], 16, 1, 576, 512, 64, is_mla=True, num_kv_splits=16)
# 128 heads: two 64-head groups; fixed copies whole tiles with TMA, legacy loads pointers.
MLA_REAL_WIDE = Case("mla_128_heads_page64_4k", [4096 - 5 * i for i in range(16)], 128, 1, 576, 512, 64, is_mla=True)


def kimi_real_pages(gen: torch.Generator) -> list[list[int]]:
    """Every page id at or past 7,768, shuffled; one sequence also keeps low ids."""
    counts = [-(-n // KIMI_PAGE_SIZE) for n in KIMI_REAL.seq_lens]
    ids = (FIRST_WRAPPING_PAGE + torch.randperm(sum(counts) + 8, generator=gen, device=DEVICE)).tolist()
    pages = [ids[sum(counts[:i]) : sum(counts[: i + 1])] for i in range(len(counts))]
    pages[-1][:3] = [1, 2, 3]
    return pages


@pytest.mark.gpu
@needs_gpu
def test_real_size_kimi_page_ids(huge_buffer: Callable[[int, torch.dtype], torch.Tensor], gen: torch.Generator) -> None:
    dtype = torch.bfloat16
    pages = kimi_real_pages(gen)
    num_elements = (max(map(max, pages)) + 1) * KIMI_PAGE_STRIDE
    k = sparse_mla_cache(KIMI_REAL, dtype, gen, pages, huge_buffer(num_elements, dtype), 0)
    err_o, err_lse = run(KIMI_REAL, k, k[..., :512], block_table(pages), dtype, gen, "fixed")
    assert err_o < 1e-2
    assert err_lse < 1e-2


@pytest.mark.gpu
@needs_gpu
def test_real_size_kimi_legacy_faults() -> None:
    """The legacy twin on the same geometry, in its own process (a fault ends the CUDA
    context): it must not finish with the right answer."""
    script = textwrap.dedent(
        """
        import torch
        from tests.kernels import test_decode_attention as t
        gen = torch.Generator(device="cuda").manual_seed(7)
        pages = t.kimi_real_pages(gen)
        buffer = torch.empty((max(map(max, pages)) + 1) * t.KIMI_PAGE_STRIDE, dtype=torch.bfloat16, device="cuda")
        k = t.sparse_mla_cache(t.KIMI_REAL, torch.bfloat16, gen, pages, buffer, 0)
        err, _ = t.run(t.KIMI_REAL, k, k[..., :512], t.block_table(pages), torch.bfloat16, gen, "legacy")
        torch.cuda.synchronize()
        print("legacy relative error", err)
        raise SystemExit(0 if err < 1e-2 else 3)
        """
    )
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=600)
    print(done.stdout[-2000:], done.stderr[-2000:])
    assert done.returncode != 0


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("variant", ["fixed", "legacy"])
@pytest.mark.parametrize("case", [GQA_REAL, MLA_REAL, MLA_REAL_WIDE], ids=lambda c: c.name)
def test_real_sizes_match_reference(case: Case, variant: str, gen: torch.Generator) -> None:
    pages, num_pages = shuffled_pages(gen, case.seq_lens, case.page_size)
    k, v = make_cache(case, torch.bfloat16, gen, pages, num_pages)
    err_o, err_lse = run(case, k, v, block_table(pages), torch.bfloat16, gen, variant)
    assert err_o < 1e-2
    assert err_lse < 1e-2


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("num_heads", [16, 128], ids=["16_heads", "128_heads_tma"])
def test_cuda_graph_replay_follows_new_seq_lens(num_heads: int, gen: torch.Generator) -> None:
    """Captured once (the grid fixed by the batch size), replayed with other length mixes in
    the same tensors: every replay schedules its pieces from the new seq_lens. 128 heads run
    as 64-head groups whose whole tiles are TMA copies (the descriptors are captured by value
    and name the same cache on every replay)."""
    longest, batch = 8192, 16
    case = Case("mla_graph", [longest] * batch, num_heads, 1, 576, 512, 64, is_mla=True)
    pages, num_pages = shuffled_pages(gen, case.seq_lens, case.page_size)
    k, v = make_cache(case, torch.bfloat16, gen, pages, num_pages)
    table = block_table(pages)
    q = randn(gen, batch, case.num_heads, case.lk, dtype=torch.bfloat16)
    o = torch.empty(batch, case.num_heads, case.lv, dtype=torch.bfloat16, device=DEVICE)
    lse = torch.empty(batch, case.num_heads, device=DEVICE)
    logits = torch.empty(batch, case.num_heads, 4, case.lv + 1, device=DEVICE)
    lens = torch.tensor(case.seq_lens, dtype=torch.int32, device=DEVICE)
    scale = case.lk**-0.5

    def call() -> None:
        decode_attention_fwd(q, k, v, o, lse, table, lens, logits, 4, scale, case.page_size, is_mla=True)

    call()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    mixes = [[longest] * batch, [1] * (batch - 1) + [longest], [0, 3, 64, 65, 4000, 129, 7000, 1] * 2]
    for mix in mixes:
        lens.copy_(torch.tensor(mix, dtype=torch.int32))
        q.copy_(randn(gen, *q.shape, dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        ref_o, ref_lse = decode_attention_reference(q, k, v, table, lens, scale, case.page_size)
        full = lens > 0
        assert relative_error(o[full], ref_o[full]) < 1e-2, mix
        assert relative_error(lse[full], ref_lse[full]) < 1e-2, mix
        assert (o[~full] == 0).all()
