"""Invariance: the same tokens under two serving conditions must give the same distributions.

An `Observation` is what the engine reported for one prompt under one condition: the token
sequence it conditioned on (prompt + continuation) and the top-k before each position it
reported, in the prompt's own frame (position t is the distribution before token t of prompt +
continuation; a long-context request's preamble is not counted). Two observations compare on
the positions both reported whose preceding tokens agree: a teacher-forced pass conditions on
given tokens everywhere, a decode path on its own greedy tokens, so after two decodes part
ways nothing further is comparable. Per prompt and condition the comparison is a
`PromptDrift` (KL over top-k plus a rest bucket, argmax agreement, first divergent position,
the close rule; `evals.logprob_drift`), beside the same comparison for the condition's A/A
floor and, for a later arm, the control arm's rows of the same condition (`attach_control`).
The verdict over them is `evals.invariance_verdict`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evals.logprob_drift import PromptDrift, TopK, kl_topk, largest


@dataclass(frozen=True)
class Condition:
    """A serving condition: what it compares, with what floor, and why the floor is that one."""

    label: str  # "prefix-cache hits": reads "diverges only on prefix-cache hits"
    compares: str
    floor: str


CONDITIONS: dict[str, Condition] = {
    "batch": Condition(
        "batch composition",
        "the prompt alone vs inside a full ragged batch sent at the same moment (teacher-forced prompt, greedy "
        "continuation)",
        "two ragged batches of other compositions: vLLM documents batch composition as not invariant without its "
        "batch-invariant mode, so this condition is held to its own measured floor, not to zero",
    ),
    "prefix_hit": Condition(
        "prefix-cache hits",
        "cold vs a prefix-cache hit on the prompt's whole blocks (greedy continuation; vLLM skips the cache for "
        "prompt_logprobs requests)",
        "the cold request twice",
    ),
    "prefix_family": Condition(
        "a family sharing a cached few-shot prefix",
        "cold vs all prompts sent together after their shared few-shot prefix was cached (greedy continuation)",
        "the family twice in other orders (a batch: its own floor)",
    ),
    "long_context": Condition(
        "long context",
        "after a long neutral preamble near max_model_len: the prompt's and continuation's positions decoded vs "
        "teacher-forced (a preamble changes what a model predicts, so short and long are not compared directly)",
        "the long prompt twice",
    ),
    "decode_prefill": Condition(
        "decode vs prefill",
        "the greedy continuation's logprobs from the decode path vs the same tokens teacher-forced through prefill",
        "the decode path twice",
    ),
    "arm": Condition(
        "the engine change between arms",
        "this arm's teacher-forced pass over the control arm's sequence vs the control's own",
        "the control arm alone twice",
    ),
}


@dataclass(frozen=True)
class Observation:
    tokens: Sequence[int]
    tops: Mapping[int, TopK]
    answered: bool = True  # False: the server could not serialise its logprobs (NaN or infinity)

    def finite(self) -> bool:
        return self.answered and all(math.isfinite(lp) for top in self.tops.values() for lp in top.values())


def pack(observation: Observation) -> dict[str, Any]:
    """The JSON a sample stores; a non-finite logprob is stored as null."""
    return {
        "tokens": list(observation.tokens),
        "tops": [[t, [[tok, lp if math.isfinite(lp) else None] for tok, lp in top.items()]]
                 for t, top in sorted(observation.tops.items())],
        "answered": observation.answered,
    }  # fmt: skip


def unpack(data: Mapping[str, Any]) -> Observation:
    tops = {int(t): {int(tok): math.nan if lp is None else float(lp) for tok, lp in top} for t, top in data["tops"]}
    return Observation([int(t) for t in data["tokens"]], tops, bool(data.get("answered", True)))


def _argmax(top: TopK) -> int | None:
    return max(top, key=top.__getitem__) if top else None


def observe(reference: Observation, candidate: Observation, since: int = 1) -> tuple[PromptDrift, int]:
    """The comparison of two observations of one prompt on their comparable positions from `since`,
    and how many positions that was (first_divergence: the first position whose argmax differs)."""
    common = min(len(reference.tokens), len(candidate.tokens))
    split = next((i for i in range(common) if reference.tokens[i] != candidate.tokens[i]), common)
    positions = sorted(t for t in reference.tops.keys() & candidate.tops.keys() if since <= t <= split)
    finite = reference.finite() and candidate.finite()
    kls, deltas, agree = [], [], []
    first, close = None, True
    for t in positions:
        ref, cand = reference.tops[t], candidate.tops[t]
        top_ref, top_cand = _argmax(ref), _argmax(cand)
        agree.append(top_ref == top_cand)
        if top_ref != top_cand and first is None:
            first, close = t, top_cand in ref and top_ref in cand
        if finite:
            kls.append(kl_topk(ref, cand))
            if top_ref is not None and top_ref in cand:
                deltas.append(abs(ref[top_ref] - cand[top_ref]))
    drift = PromptDrift(
        first_divergence=first,
        close=close,
        mean_abs_dlogprob=_mean(deltas),
        mean_kl=_mean(kls),
        max_kl=max(kls, default=0.0),
        argmax_agreement=_mean([float(a) for a in agree]) if agree else 1.0,
        max_abs_dlogprob=max(deltas, default=0.0),
        finite=finite,
        top_kls=largest(kls),
    )
    return drift, len(positions)


def row(drift: tuple[PromptDrift, int], floor: tuple[PromptDrift, int], **notes: Any) -> dict[str, Any]:
    """One prompt's stored result for one condition (`notes`: what was verified, e.g. cached tokens)."""
    return {"drift": drift[0].as_dict(), "positions": drift[1], "floor": floor[0].as_dict(),
            "floor_positions": floor[1], **notes}  # fmt: skip


def skipped(reason: str) -> dict[str, Any]:
    return {"skipped": reason}


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _label(name: str) -> str:
    return CONDITIONS[name].label if name in CONDITIONS else name


def where(position: int, prompt_len: int) -> str:
    """A position in words: inside the prompt, or the continuation's n-th token."""
    return f"prompt position {position}" if position < prompt_len else f"continuation token {position - prompt_len}"


def attach_control(conditions: dict[str, dict[str, Any]], control: Mapping[str, Any]) -> None:
    """Each built condition row of an arm gets the control arm's rows of the same condition and
    prompt (`control`: the control's stored `conditions`), for the judgement against the control."""
    for name, found in conditions.items():
        theirs = control.get(name)
        if "skipped" not in found and theirs and "skipped" not in theirs:
            found["control"] = {"drift": theirs["drift"], "floor": theirs["floor"]}
