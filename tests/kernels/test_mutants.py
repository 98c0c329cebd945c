"""Every catalogued mutant against fixed: different under its condition, identical elsewhere.

One case pair per mutant (``kernels.mutants.CATALOGUE``), on tiny shapes in Triton's
interpreter (fp16, as the other kernel tests): the same inputs go to ``fixed`` and to the
mutant. "Elsewhere" is bitwise: the fixed kernels are deterministic, so the fixed-vs-fixed
floor is zero. A mutant carried by both kernels is probed where a served fixture reaches it
(the catalogue's ``served``), the other kernel once more where that is cheap.
"""

import itertools
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kernels import mutants
from kernels._launch import LaunchConfig
from kernels.decode_attention import decode_attention_fwd
from kernels.unified_attention import unified_attention
from tests.kernels.conftest import DEVICE, block_table, cu_seqlens, fill_unwritten, paged_cache, randn, shuffled_pages
from tests.kernels.test_decode_attention import FIRST_WRAPPING_PAGE, KIMI_PAGE_SIZE, KIMI_PAGE_STRIDE

DTYPE = torch.float16
HEAD_SIZE = 32
Run = Callable[[str], list[torch.Tensor]]  # variant -> each sequence's output, on inputs fixed when built


@dataclass(frozen=True)
class Unified:
    query_lens: list[int]
    seq_lens: list[int]
    causal: bool = True
    window_left: int = -1
    config: LaunchConfig | None = None
    scale: float = HEAD_SIZE**-0.5
    same: tuple[int, ...] = ()  # sequences the condition leaves alone: their rows stay bitwise equal

    def build(self, gen: torch.Generator) -> Run:
        cache = paged_cache(gen, self.seq_lens, 16, 2, HEAD_SIZE, DTYPE)
        q = randn(gen, sum(self.query_lens), 4, HEAD_SIZE, dtype=DTYPE)
        cu = cu_seqlens(self.query_lens)
        window = (self.window_left, 0 if self.window_left >= 0 else -1)

        def run(variant: str) -> list[torch.Tensor]:
            out = torch.full_like(q, float("nan"))
            unified_attention(
                q, cache.k, cache.v, out, cu, max(self.query_lens), cache.seq_lens, max(self.seq_lens),
                self.scale, self.causal, window, cache.block_table, 0.0, None, None, None,
                variant=variant, config=self.config,
            )  # fmt: skip
            starts = cu.tolist()
            return [out[a:b] for a, b in itertools.pairwise(starts)]

        return run


@dataclass(frozen=True)
class Decode:
    """MLA decode (576-wide latent keys, values their first 512 columns) on ``page_size`` pages;
    ``pages`` places them (default: shuffled small ids)."""

    seq_lens: list[int]
    page_size: int = 16
    pages: list[list[int]] | None = None
    config: LaunchConfig | None = None
    same: tuple[int, ...] = ()

    def build(self, gen: torch.Generator, huge_buffer: Callable[[int, torch.dtype], torch.Tensor]) -> Run:
        heads, lk = 16, 576
        if self.pages is None:
            pages, num_pages = shuffled_pages(gen, self.seq_lens, self.page_size)
            k = randn(gen, num_pages, self.page_size, 1, lk, dtype=DTYPE)
        else:
            # Page ids whose offsets pass 2^31 elements: a lazy buffer, 2^31 elements of room
            # before the cache so that wrapped int32 offsets land in memory the test owns.
            pages, offset = self.pages, 2**31
            num_pages = max(map(max, pages)) + 1
            buffer = huge_buffer(offset + num_pages * self.page_size * lk, DTYPE)
            k = buffer[offset:].view(num_pages, self.page_size, 1, lk)
            for page in {p for ids in pages for p in ids}:
                k[page] = randn(gen, self.page_size, 1, lk, dtype=DTYPE)
        fill_unwritten([k], pages, self.seq_lens)
        table = block_table(pages)
        batch = len(self.seq_lens)
        q = randn(gen, batch, heads, lk, dtype=DTYPE)
        lens = torch.tensor(self.seq_lens, dtype=torch.int32, device=DEVICE)
        logits = torch.empty((batch, heads, 4, 513), device=DEVICE)

        def run(variant: str) -> list[torch.Tensor]:
            o = torch.full((batch, heads, 512), float("nan"), dtype=DTYPE, device=DEVICE)
            lse = torch.full((batch, heads), float("nan"), device=DEVICE)
            decode_attention_fwd(
                q, k, k[..., :512], o, lse, table, lens, logits, 4, lk**-0.5, self.page_size, 0.0, None, None, True,
                variant=variant, config=self.config,
            )  # fmt: skip
            return list(torch.cat([o.float(), lse[..., None]], dim=-1))

        return run


Probe = Unified | Decode
SPLIT = LaunchConfig(num_splits=8)
# mutant -> (under its condition, elsewhere)
PROBES: dict[str, tuple[Probe, Probe]] = {
    # A chunk of 5 queries after 35 context keys (prefix-cache hit) beside a decode;
    # elsewhere: a first chunk (no context) beside a decode.
    "chunk_context_skip": (Unified([5, 1], [40, 20], same=(1,)), Unified([20, 1], [20, 33])),
    # Decode of two sequences; elsewhere one sequence alone (prefill and decode rows).
    "batch_row_shift": (Decode([40, 70], same=(0,)), Decode([70])),
    # Split decode: 130 keys in several pieces; elsewhere each sequence in one piece.
    "split_lse_merge": (
        Decode([130, 9], config=SPLIT, same=(1,)),
        Decode([20, 9], config=LaunchConfig(num_splits=2)),
    ),
    # The same condition; the base mix-up moves the last piece's weight by several nats.
    "split_lse_base2": (
        Decode([130, 9], config=SPLIT, same=(1,)),
        Decode([20, 9], config=LaunchConfig(num_splits=2)),
    ),
    # A 9-key window over 30 and 41 keys, beside a sequence shorter than the window;
    # elsewhere the same batch without a window.
    "window_edge_leak": (Unified([5, 1, 4], [30, 41, 6], window_left=8, same=(2,)), Unified([5, 1, 4], [30, 41, 6])),
    # Cross-attention over NaN block tails; elsewhere the same batch causal.
    "tail_read": (Unified([1, 3], [29, 16], causal=False), Unified([1, 3], [29, 16])),
    # Page 7,768 of 480-token pages of 576 (past 2^31 elements); elsewhere small page ids.
    "page_offset_i32": (
        Decode([40, 30], KIMI_PAGE_SIZE, pages=[[FIRST_WRAPPING_PAGE], [7]], same=(1,)),
        Decode([40, 30], KIMI_PAGE_SIZE),
    ),
    # Every call; elsewhere: the mutant is fixed at the drifted scale, bit for bit.
    "softmax_scale_drift": (
        Unified([1, 4], [20, 33]),
        Unified([1, 4], [20, 33], scale=mutants.drifted_scale(HEAD_SIZE**-0.5)),
    ),
}
# The second kernel of mutants carried by both: under the condition only.
OTHER_KERNEL: dict[str, Probe] = {
    "batch_row_shift": Unified([3, 1], [20, 37], same=(0,)),
    "split_lse_merge": Unified([1, 1], [130, 9], config=SPLIT, same=(1,)),
    "split_lse_base2": Unified([1, 1], [130, 9], config=SPLIT, same=(1,)),
    "softmax_scale_drift": Decode([40]),
}


def test_catalogue_is_probed() -> None:
    assert set(PROBES) == set(mutants.MUTANTS)
    assert KIMI_PAGE_STRIDE * FIRST_WRAPPING_PAGE >= 2**31


def _differs(fixed: list[torch.Tensor], mutant: list[torch.Tensor], same: tuple[int, ...]) -> bool:
    """Each sequence outside ``same`` not equal (a NaN counts as a difference), each in ``same``
    bitwise equal."""
    for index, (a, b) in enumerate(zip(fixed, mutant, strict=True)):
        if index in same:
            assert torch.equal(a, b), f"sequence {index} changed, though the condition leaves it alone"
        elif torch.isfinite(b).all() and (a.float() - b.float()).abs().max() <= 1e-3:
            return False
    return True


def _equal(fixed: list[torch.Tensor], mutant: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(fixed, mutant, strict=True))


@pytest.mark.slow
@pytest.mark.usefixtures("kernel_runtime")
@pytest.mark.parametrize("name", list(PROBES))
def test_mutant_differs_under_its_condition_only(
    name: str, huge_buffer: Callable[[int, torch.dtype], torch.Tensor]
) -> None:
    def build(probe: Probe, seed: int) -> Run:
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        return probe.build(gen, huge_buffer) if isinstance(probe, Decode) else probe.build(gen)

    condition, elsewhere = PROBES[name]
    seed = zlib.crc32(name.encode())
    run = build(condition, seed)
    fixed = run("fixed")
    assert all(torch.isfinite(rows).all() for rows in fixed)
    assert _differs(fixed, run(name), condition.same), f"{name} computes fixed's result under its condition"
    if name == "softmax_scale_drift":
        # Its condition is every call: the same inputs at the drifted scale are what it computes.
        assert _equal(build(elsewhere, seed)("fixed"), run(name))
    else:
        run = build(elsewhere, seed + 1)
        assert _equal(run("fixed"), run(name)), f"{name} differs from fixed outside its condition"
    other = OTHER_KERNEL.get(name)
    if other is not None:
        run = build(other, seed + 2)
        assert _differs(run("fixed"), run(name), other.same), f"{name} is not carried by the second kernel"


def test_drifted_scale_is_one_bf16_ulp() -> None:
    assert mutants.drifted_scale(64**-0.5) == 0.125 + 2**-10 == 0.1259765625
    for scale in (192**-0.5, 128**-0.5, 0.3, 1.0):
        power = 2.0 ** math.floor(math.log2(scale))
        assert mutants.drifted_scale(scale) - scale == power * 2**-7  # 8 significant bits


def test_one_list_for_kernels_plugin_profiles_and_docs() -> None:
    from typing import get_args

    reason = "the profile schema needs the service's packages; a GPU host's kernel run has torch and triton only"
    pytest.importorskip("pydantic", reason=reason)

    from kernels.vllm_plugin import PluginConfig
    from service.profiles import Variant

    assert get_args(Variant) == mutants.VARIANTS == (*mutants.KERNEL_VARIANTS, "stock")
    for name in mutants.MUTANTS:
        config = PluginConfig.from_env({"KVCANARY_KERNEL_VARIANT": name})
        assert config is not None and config.variant == name
    with pytest.raises(ValueError, match="chunk_context_skip"):
        PluginConfig.from_env({"KVCANARY_KERNEL_VARIANT": "no_such_mutant"})
    docs = (Path(__file__).parents[2] / "docs" / "mutants.md").read_text()
    assert mutants.catalogue_table() in docs, "docs/mutants.md: paste kernels.mutants.catalogue_table() again"
    assert [name for name in mutants.MUTANTS if mutants.in_kernel(name, mutants.UNIFIED)] == [
        "chunk_context_skip", "batch_row_shift", "split_lse_merge", "split_lse_base2", "window_edge_leak",
        "softmax_scale_drift",
    ]  # fmt: skip
    assert mutants.has("legacy", "tail_read") and mutants.has("legacy", "page_offset_i32")
    assert not mutants.has("legacy", "batch_row_shift") and mutants.in_kernel("legacy", mutants.DECODE) == ""
