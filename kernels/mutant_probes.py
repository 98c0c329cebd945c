"""The shapes a generated mutant is compared with ``fixed`` on, in Triton's interpreter.

They cover what the served fixtures run: the unified kernel's prefill chunks after context
(chunked prefill and prefix-cache hits), first prefills and decode on 16-token blocks, in
more than one 32-key tile, and its split decode; MLA split decode (576-wide latent keys,
4 heads as the GPU fixture has) on 16- and 480-token pages. fp16 throughout (the interpreter
computes ``tl.dot`` on bf16 wrongly). Each sequence's pages sit at shuffled ids, with NaN in
every slot at or past its length (a cache whose tail was never written), so a read past a
bound shows. Inputs come from a fixed seed: the same on every run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels._launch import LaunchConfig

DTYPE = torch.float16
Entry = Callable[..., None]  # unified_attention or decode_attention_fwd, of fixed or of a family


@dataclass(frozen=True)
class Shape:
    name: str
    what: str
    kernel: str  # the entry point it calls
    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...] = ()  # unified only
    page_size: int = 16
    num_splits: int | None = None


SHAPES: tuple[Shape, ...] = (
    Shape(
        "prefill_b16",
        "unified, 16-token blocks: a 5-token chunk after 35 context keys, a decode at 70 keys, first prefills of "
        "20 and 3 tokens (32-key tiles, GQA 2:1)",
        "unified_attention",
        (40, 70, 20, 3),
        (5, 1, 20, 3),
    ),
    Shape(
        "chunk_b16",
        "unified, 16-token blocks: chunks of 16 tokens after 16 and 45 context keys (chunked prefill)",
        "unified_attention",
        (32, 61),
        (16, 16),
    ),
    Shape(
        "decode_b16",
        "unified decode, 16-token blocks, unsplit: 33, 64 and 7 keys",
        "unified_attention",
        (33, 64, 7),
        (1, 1, 1),
    ),
    Shape(
        "split_decode_b16",
        "unified split decode, 16-token blocks: 600 and 9 keys over 16 work items (more pieces than the merge "
        "takes in one step)",
        "unified_attention",
        (600, 9),
        (1, 1),
        num_splits=16,
    ),
    Shape(
        "mla_p16",
        "MLA split decode, 16-token pages: 40, 70 and 9 keys over 8 work items",
        "decode_attention_fwd",
        (40, 70, 9),
        num_splits=8,
    ),
    Shape(
        "mla_p480",
        "MLA split decode, 480-token pages: 500 and 40 keys over 4 work items (64-key tiles meet two pages)",
        "decode_attention_fwd",
        (500, 40),
        page_size=480,
        num_splits=4,
    ),
)
SHAPE_NAMES = {shape.name: shape for shape in SHAPES}


def _pages(
    gen: torch.Generator, seq_lens: tuple[int, ...], page_size: int
) -> tuple[torch.Tensor, int, list[list[int]]]:
    """A block table of shuffled page ids (two spare pages a sequence) and the pool size."""
    counts = [-(-n // page_size) + 2 for n in seq_lens]
    total = sum(counts) + 3
    order = torch.randperm(total, generator=gen).tolist()
    starts = list(itertools.accumulate(counts, initial=0))
    pages = [order[a : a + n] for a, n in zip(starts, counts, strict=False)]
    width = max(counts) + 8
    table = torch.tensor([ids + [ids[-1]] * (width - len(ids)) for ids in pages], dtype=torch.int32)
    return table, total, pages


def _poison_tails(caches: list[torch.Tensor], pages: list[list[int]], seq_lens: tuple[int, ...]) -> None:
    page_size = caches[0].shape[1]
    for ids, length in zip(pages, seq_lens, strict=True):
        for index, page in enumerate(ids):
            unwritten = length - index * page_size
            if unwritten < page_size:
                for cache in caches:
                    cache[page, max(unwritten, 0) :] = float("nan")


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(DTYPE)


def run(shape: Shape, entry: Entry, seed: int = 44) -> torch.Tensor:
    """The shape's output through ``entry`` (called with ``variant="fixed"``), as one fp32 tensor:
    the attention output, and for MLA decode the log-sum-exp beside it."""
    gen = torch.Generator().manual_seed(seed)
    config = LaunchConfig(num_splits=shape.num_splits) if shape.num_splits else None
    table, num_pages, pages = _pages(gen, shape.seq_lens, shape.page_size)
    lens = torch.tensor(shape.seq_lens, dtype=torch.int32)
    if shape.kernel == "unified_attention":
        head = 32
        k, v = _randn(gen, num_pages, 2, shape.page_size, 2, head).unbind(1)
        _poison_tails([k, v], pages, shape.seq_lens)
        q = _randn(gen, sum(shape.query_lens), 4, head)
        cu = torch.tensor(list(itertools.accumulate(shape.query_lens, initial=0)), dtype=torch.int32)
        out = torch.full_like(q, float("nan"))
        entry(
            q, k, v, out, cu, max(shape.query_lens), lens, max(shape.seq_lens), head**-0.5, True, (-1, -1),
            table, 0.0, None, None, None, variant="fixed", config=config,
        )  # fmt: skip
        return out.float()
    heads, lk, lv = 4, 576, 512
    k = _randn(gen, num_pages, shape.page_size, 1, lk)
    _poison_tails([k], pages, shape.seq_lens)
    batch = len(shape.seq_lens)
    q = _randn(gen, batch, heads, lk)
    o = torch.full((batch, heads, lv), float("nan"), dtype=DTYPE)
    lse = torch.full((batch, heads), float("nan"))
    logits = torch.empty((batch, heads, 4, lv + 1))
    entry(
        q, k, k[..., :lv], o, lse, table, lens, logits, 4, lk**-0.5, shape.page_size, 0.0, None, None, True,
        variant="fixed", config=config,
    )  # fmt: skip
    return torch.cat([o.float(), lse[..., None]], dim=-1)


def difference(fixed: torch.Tensor, mutant: torch.Tensor) -> float | str:
    """max |mutant - fixed|; "nan" where the mutant is not finite where fixed is."""
    if not torch.equal(torch.isfinite(fixed), torch.isfinite(mutant)):
        return "nan"
    finite = torch.isfinite(fixed)
    return float((fixed[finite] - mutant[finite]).abs().max()) if finite.any() else 0.0
