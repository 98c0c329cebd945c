"""The kernel variants and the mutant catalogue: one list that the kernels, the plugin, the
profile schema, the CLI and the docs all read.

A mutant is a small, documented change of the fixed kernels modelled on a public bug report,
selected like ``legacy`` (``KVCANARY_KERNEL_VARIANT`` through the plugin, ``variant=`` on the
launchers). Outside its condition it computes exactly what ``fixed`` computes. Each is a
compile-time switch (a ``tl.constexpr`` that the fixed variant leaves off, or a host-side
argument change), so the fixed kernels' compiled code is the same with or without the catalogue.
``legacy`` is ``tail_read`` and ``page_offset_i32`` together: the two seed bugs.

The generated mutants (``kernels.generated_mutants``: operators over the Triton sources, a
tuning and a held-out half) are kernel variants too, selected the same ways by their ids; the
catalogue stays for the named bug classes.

This module imports nothing (no torch, no Triton): the service and the CI client read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernels import generated_mutants

UNIFIED = "unified_attention"
DECODE = "decode_attention_fwd"


@dataclass(frozen=True)
class Mutant:
    """One catalogued bug class.

    ``kernels``: the entry points that carry the change (a launcher not named here runs its
    fixed code for this variant). ``path``: where in them. ``canaries``: what a served run arms
    so that the condition can occur at all (the seed bugs need NaN tails or high page ids).
    ``served``: which GPU fixture reaches the condition, or why none does.
    """

    name: str
    changes: str
    condition: str
    models: str
    kernels: tuple[str, ...]
    path: str
    served: str
    canaries: tuple[str, ...] = ()


CATALOGUE: tuple[Mutant, ...] = (
    Mutant(
        name="chunk_context_skip",
        changes="a prefill chunk drops the keys of its last context tile (from the tile that holds "
        "context position context_len - 1 up to context_len)",
        condition="a chunk of more than one query token whose sequence already has context "
        "(chunked prefill, or a prefix-cache hit)",
        models="the MLA/GQA chunked-prefill class of vLLM #26042",
        kernels=(UNIFIED,),
        path="unified_attention, unsplit programs (prefill and mixed batches)",
        served="TRITON_ATTN Llama: GSM8k few-shot prompts share cached prefix blocks, so prefills start "
        "with context; TRITON_MLA prefill runs on FlashAttention, so not on the MLA fixture",
    ),
    Mutant(
        name="batch_row_shift",
        changes="for every sequence after the first of a batch, the tile holding its last key reads "
        "the block-table row of the sequence before it",
        condition="batches of more than one sequence",
        models="the batch > 1 class of SGLang #22688 (a sequence reading another's pages)",
        kernels=(UNIFIED, DECODE),
        path="unified_attention (every path) and decode_attention_fwd (split decode, stage 1)",
        served="both fixtures: TRITON_ATTN Llama (prefill and decode), TRITON_MLA decode; the suites "
        "send concurrent requests",
    ),
    Mutant(
        name="split_lse_merge",
        changes="the split-KV merge adds 1/16 to the log-sum-exp of a sequence's last piece",
        condition="a sequence whose keys were cut into more than one piece (split decode)",
        models="the split-KV merge class of aiter #3606 (only with more than one split)",
        kernels=(UNIFIED, DECODE),
        path="the shared merge (kernels._split_kv), after split decode in either kernel",
        served="TRITON_MLA decode (it always splits; pieces of 256+ keys); the TRITON_ATTN Llama's "
        "1,024 positions stay below the unified kernel's split threshold, so not on that fixture",
    ),
    Mutant(
        name="split_lse_base2",
        changes="the split-KV merge reads the log-sum-exp of a sequence's last piece in base 2 (times "
        "log2 e), as a natural-log merge handed a base-2 log-sum-exp does",
        condition="a sequence whose keys were cut into more than one piece (split decode)",
        models="the log-sum-exp base mix-up of vLLM PR #52796 (FlashInfer's base-2 log-sum-exp merged "
        "in natural log: garbled output on prefix-cache hits) and FlashInfer PR #4547",
        kernels=(UNIFIED, DECODE),
        path="the shared merge (kernels._split_kv), after split decode in either kernel",
        served="as split_lse_merge: TRITON_MLA decode; not the TRITON_ATTN Llama",
    ),
    Mutant(
        name="window_edge_leak",
        changes="a sliding window's lower edge moves one tile earlier: the keys of the tile before the "
        "window's start are attended",
        condition="sliding-window attention with keys before the window",
        models="vLLM #30887 class (a sliding-window kernel reading V one tile before the window)",
        kernels=(UNIFIED,),
        path="unified_attention with a window (all paths)",
        served="none: no fixture has a sliding window; proven at kernel level only",
    ),
    Mutant(
        name="tail_read",
        changes="non-causal programs load K/V and block-table entries past seq_len (the pre-fix bound), "
        "relying on the score mask: NaN in the unwritten tail poisons the output",
        condition="non-causal attention (cross-attention) whose last block's tail holds NaN",
        models="vLLM PR #47305 (seed 1, the tail-read half of legacy)",
        kernels=(UNIFIED,),
        path="unified_attention, non-causal programs",
        served="Whisper cross-attention with nan_kv_tail (whisper-tiny-en-gpu); the Llama is causal, "
        "where the pre-fix bound never passed seq_len, and MLA decode never calls unified_attention",
        canaries=("nan_kv_tail",),
    ),
    Mutant(
        name="page_offset_i32",
        changes="page offsets (page id x page stride) in int32, which wrap past 2^31 elements",
        condition="page ids whose offset passes 2^31 elements (MLA, 480-token pages: ids past 7,767)",
        models="vLLM PR #47671 (seed 2, the int32 half of legacy)",
        kernels=(DECODE,),
        path="decode_attention_fwd, stage 1 (pointer loads; no TMA copies)",
        served="TRITON_MLA with 480-token pages and high_block_ids (wrong pages, or an illegal memory "
        "access); the unified kernel has no int32 page offsets, so not on the Llama",
        canaries=("high_block_ids",),
    ),
    Mutant(
        name="softmax_scale_drift",
        changes="the softmax scale one bf16 ulp too large (0.125 becomes 0.1259765625)",
        condition="every call (a numeric-only change)",
        models="scale rounded through a low-precision type (a numeric drift no crash reveals)",
        kernels=(UNIFIED, DECODE),
        path="both launchers (host side: the scale passed to the kernel)",
        served="both fixtures",
    ),
)

MUTANTS: dict[str, Mutant] = {m.name: m for m in CATALOGUE}
LEGACY_PARTS = ("tail_read", "page_offset_i32")
GENERATED: tuple[str, ...] = tuple(generated_mutants.kept())  # both halves, in the manifest's order
KERNEL_VARIANTS: tuple[str, ...] = ("fixed", "legacy", *MUTANTS, *GENERATED)  # what the launchers take
VARIANTS: tuple[str, ...] = (*KERNEL_VARIANTS, "stock")  # what the plugin and profiles take
WHERE_LISTED = f"kernels/mutants.py (fixed, legacy, stock, the catalogue) and {generated_mutants.MANIFEST_NAME}"


def has(variant: str, mutant: str) -> bool:
    """Whether kernels of ``variant`` carry the change ``mutant`` (legacy carries its two parts)."""
    return variant == mutant or (variant == "legacy" and mutant in LEGACY_PARTS)


def in_kernel(variant: str, kernel: str) -> str:
    """The mutant name a kernel's ``MUTANT`` switch gets: the variant where that kernel carries it,
    else "" (the kernel's fixed code; legacy's parts have switches of their own)."""
    mutant = MUTANTS.get(variant)
    return variant if mutant is not None and kernel in mutant.kernels and variant not in LEGACY_PARTS else ""


def drifted_scale(scale: float) -> float:
    """``scale`` plus one bf16 ulp at its magnitude (8 significant bits)."""
    if scale == 0 or not math.isfinite(scale):
        return scale
    exponent = math.frexp(abs(scale))[1] - 1  # abs(scale) = m * 2**exponent with 1 <= m < 2
    return scale + math.copysign(2.0 ** (exponent - 7), scale)


def unknown_variant() -> str:
    """What an unknown variant is told: the kinds, and where they are listed (too many to repeat)."""
    return (
        f"no kernel variant: fixed, legacy, stock (plugin and profiles only), the catalogue's mutants "
        f"({', '.join(MUTANTS)}) or one of the {len(GENERATED)} generated mutants (gen_...); listed in {WHERE_LISTED}"
    )


def check_variant(function: str, variant: str) -> None:
    if variant not in KERNEL_VARIANTS:
        raise ValueError(f"{function}: variant {variant!r} is {unknown_variant()}")


def canaries(variant: str) -> tuple[str, ...]:
    """What a served run arms so that the variant's condition can occur (none for generated mutants)."""
    mutant = MUTANTS.get(variant)
    return mutant.canaries if mutant is not None else ()


def batch(names: list[str] | None, half: str | None) -> list[str]:
    """The mutants a mutation batch runs: ``names`` (catalogued or generated) and the generated
    ``half`` ("tuning" or "held-out"); neither: the whole catalogue. ValueError names what is unknown."""
    unknown = [name for name in names or [] if name not in MUTANTS and name not in GENERATED]
    if unknown:
        raise ValueError(
            f"unknown mutant {', '.join(unknown)}: a catalogued mutant ({', '.join(MUTANTS)}) or a kept generated "
            f"one (gen_...), listed in {WHERE_LISTED}"
        )
    if not names and half is None:
        return list(MUTANTS)
    chosen = list(dict.fromkeys([*(names or []), *(generated_mutants.manifest().half(half) if half else [])]))
    if not chosen:
        raise ValueError(
            f"the {half} half of {generated_mutants.MANIFEST_NAME} is empty: run scripts/generate_mutants.py"
        )
    return chosen


def described(variant: str) -> tuple[str, str]:
    """(what it changes or under which condition, which served fixture reaches it) for a matrix row."""
    known = MUTANTS.get(variant)
    if known is not None:
        return known.condition, known.served
    made = generated_mutants.kept().get(variant)
    if made is not None:
        return f"generated, {made.half} half: {made.summary}", f"kernel level: {', '.join(made.kernels)}"
    return "not in this catalogue", ""


def catalogue_table() -> str:
    """The catalogue as the Markdown table docs/mutants.md carries (a test keeps them equal)."""
    lines = [
        "| mutant | what it changes | condition | models | where | served fixture that reaches it |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| `{m.name}` | {m.changes} | {m.condition} | {m.models} | {m.path} | {m.served} |" for m in CATALOGUE]
    return "\n".join(lines)
