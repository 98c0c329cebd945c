"""Kernel test set-up: Triton's interpreter on hosts without CUDA, and paged-cache builders.

Triton decides at decoration time whether a function is compiled or interpreted, and that
includes its own library functions (``tl.max``, ``tl.cdiv``...), decorated when triton is
first imported: often before this conftest runs (vLLM's imports reach it).
On a host without CUDA this conftest therefore (re)imports the kernel modules with
``TRITON_INTERPRET=1``, and while a kernel test runs it sets the variable (Triton reads it
again at the first launch) and swaps Triton's compiled library functions for interpreted
twins. Both are undone after each test, so no other test and no process started by one
sees them.
"""

import contextlib
import importlib
import mmap
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# In import order: the launchers import the programs, which import the split-KV helpers.
_KERNEL_MODULES = (
    "kernels._split_kv",
    "kernels._unified_kernel",
    "kernels._decode_kernel",
    "kernels.unified_attention",
    "kernels.decode_attention",
)


def _import_kernels_interpreted() -> None:
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        from triton.runtime.interpreter import InterpretedFunction

        from kernels._unified_kernel import _unified_attention_kernel

        if not isinstance(_unified_attention_kernel, InterpretedFunction):
            for name in _KERNEL_MODULES:
                sys.modules.pop(name, None)
        for name in _KERNEL_MODULES:
            importlib.import_module(name)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


if not ON_GPU:
    _import_kernels_interpreted()

_INTERPRETED_TWINS: dict[object, Any] = {}


def _interpret_triton_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Point ``tl.max``, ``tl.sum``, ``tl.cdiv``... (and the helpers they call) at interpreted
    twins, where triton was imported compiled."""
    import triton.language
    import triton.language.standard
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for module in (triton.language, triton.language.standard):
        for name, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                twin = _INTERPRETED_TWINS.setdefault(value, InterpretedFunction(value.fn))
                monkeypatch.setattr(module, name, twin)


@pytest.fixture
def kernel_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """For modules that launch kernels: ``pytestmark = pytest.mark.usefixtures("kernel_runtime")``."""
    if ON_GPU:
        return
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _interpret_triton_library(monkeypatch)


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    """A generator seeded from the test id: fresh inputs for every case, reproducible."""
    return torch.Generator(device=DEVICE).manual_seed(zlib.crc32(request.node.nodeid.encode()))


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.float32).to(dtype)


def nan_like(t: torch.Tensor) -> torch.Tensor:
    """A buffer of ``t``'s shape and dtype full of NaN: every element a kernel fails to
    write stays NaN."""
    return torch.full_like(t, float("nan"))


def shuffled_pages(
    gen: torch.Generator, seq_lens: list[int], page_size: int, spare_pages: int = 2
) -> tuple[list[list[int]], int]:
    """Page ids per sequence (its pages plus ``spare_pages`` past its end) drawn from a
    shuffled pool, and the pool size."""
    counts = [-(-n // page_size) + spare_pages for n in seq_lens]
    num_pages = sum(counts) + 3
    order = torch.randperm(num_pages, generator=gen, device=DEVICE).tolist()
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return [order[start : start + count] for start, count in zip(starts, counts, strict=True)], num_pages


def block_table(pages: list[list[int]]) -> torch.Tensor:
    """int32 table; entries past a sequence's pages repeat its last page. Wider than any
    sequence needs, as vLLM's (sized for the longest context): the legacy twin reads
    entries for a whole tile."""
    width = max(len(ids) for ids in pages) + 8
    rows = [ids + [ids[-1]] * (width - len(ids)) for ids in pages]
    return torch.tensor(rows, dtype=torch.int32, device=DEVICE)


def fill_unwritten(caches: list[torch.Tensor], pages: list[list[int]], seq_lens: list[int]) -> None:
    """NaN into every slot at or past each sequence's length: the tail of its last page and
    the pages past it. ``caches`` are page-major ``[pages, page_size, ...]`` views."""
    page_size = caches[0].shape[1]
    for ids, length in zip(pages, seq_lens, strict=True):
        for index, page in enumerate(ids):
            first_unwritten = length - index * page_size
            if first_unwritten < page_size:
                for cache in caches:
                    cache[page, max(first_unwritten, 0) :] = float("nan")


@dataclass
class PagedCache:
    """A KV cache in vLLM's TRITON_ATTN layout with each sequence's pages at shuffled ids,
    NaN in every slot at or past its length (a cache whose tail was never written)."""

    k: torch.Tensor
    v: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor


def paged_cache(
    gen: torch.Generator, seq_lens: list[int], block_size: int, num_kv_heads: int, head_size: int, dtype: torch.dtype
) -> PagedCache:
    """k/v are the two halves of one ``[blocks, 2, block_size, heads, head]`` tensor, so
    their block stride is twice a half's size."""
    pages, num_blocks = shuffled_pages(gen, seq_lens, block_size)
    k, v = randn(gen, num_blocks, 2, block_size, num_kv_heads, head_size, dtype=dtype).unbind(1)
    fill_unwritten([k, v], pages, seq_lens)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    return PagedCache(k=k, v=v, block_table=block_table(pages), seq_lens=lens)


def cu_seqlens(query_lens: list[int]) -> torch.Tensor:
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return torch.tensor(starts, dtype=torch.int32, device=DEVICE)


_MAP_NORESERVE = 0x4000  # Linux: do not reserve swap; untouched pages cost no memory.


@pytest.fixture
def huge_buffer() -> Iterator[Callable[[int, torch.dtype], torch.Tensor]]:
    """Factory of a flat 16-bit buffer of more than 2^31 elements, cheap on a CPU host.

    The int32-wrap cases need page offsets past 2^31 elements. On a CPU host the buffer is
    an anonymous mapping that commits only the pages written, so a 12 GiB buffer costs a
    few MiB (the test skips where the host refuses such a mapping: strict overcommit). On
    a GPU host it is plain device memory.
    """
    maps: list[mmap.mmap] = []

    def make(num_elements: int, dtype: torch.dtype) -> torch.Tensor:
        if ON_GPU:
            return torch.empty(num_elements, dtype=dtype, device=DEVICE)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
        try:
            region = mmap.mmap(-1, num_elements * 2, flags=flags)
        except OSError as exc:
            pytest.skip(f"this host refuses a lazy {num_elements * 2 >> 30} GiB mapping: {exc}")
        maps.append(region)
        return torch.frombuffer(region, dtype=dtype)

    yield make
    for region in maps:
        with contextlib.suppress(BufferError):  # a tensor still views it: freed with the tensor
            region.close()
