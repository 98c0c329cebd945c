"""Per-token comparison of two arms' logprobs for one prompt.

An arm's output for one prompt is its greedy tokens with the chosen token's logprob and its
top-k per step (decode path), and the top-k at every position of the reference's whole
sequence scored teacher-forced (prefill path). Two outputs compare as:

- decode: the first position where the tokens differ (None when they agree), whether the two
  tokens there are each in the other's top-k (vLLM's `check_logprobs_close` rule; a divergence
  outside it is a violation), and the mean |delta logprob| of the chosen token before it;
- prefill: per position the KL divergence of the reference's top-k distribution from the
  candidate's (the mass outside the reference's top-k in one "rest" bucket), whether the
  argmax agrees, and the largest |delta logprob| of the token the sequence actually has.

Prefill positions fall in three groups, reported apart: `shared` ones (their context lies inside
the leading tokens every prompt has, the few-shot header: the same computation in every prompt,
so they are reported but not scored), varying `prompt` ones and `answer` ones (predicting the
continuation). `mean_kl` is the mean over the varying ones, prompt and answer.
A non-finite logprob anywhere makes the prompt's KL and |delta logprob| numbers None (not
computable; never 0), with the count of positions where either arm had one.
The floor is the reference compared with itself under another batch composition: what the
engine's own nondeterminism moves; `evals.drift_verdict` judges a candidate against it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

TopK = Mapping[int, float]  # token id -> logprob, at one position
TAIL_KEPT = 8  # the largest per-position KLs a comparison keeps (`PromptDrift.top_kls`), for the tail rule
_TINY = 1e-12  # probability floor inside the KL so a token one arm rules out stays finite


@dataclass(frozen=True)
class ArmOutput:
    """One arm's answer to one prompt; `prefill_top[i]` is the top-k before sequence token i+1."""

    tokens: Sequence[int]
    logprobs: Sequence[float]
    top: Sequence[TopK]
    prefill_top: Sequence[TopK]
    prefill_logprobs: Sequence[float]  # of the sequence's own next token, teacher-forced

    def finite(self) -> bool:
        """Every logprob the engine returned is a number: a NaN or an infinity is a broken kernel."""
        values = [*self.logprobs, *self.prefill_logprobs]
        values += [lp for step in (*self.top, *self.prefill_top) for lp in step.values()]
        return all(math.isfinite(v) for v in values)

    def nonfinite_steps(self) -> set[tuple[str, int]]:
        """("decode" | "prefill", position) of every step with a non-finite logprob; a pass the
        server could not serialise at all (one NaN in place of its list) counts as one."""
        bad = {("decode", i) for i, lp in enumerate(self.logprobs) if not math.isfinite(lp)}
        bad |= {("decode", i) for i, step in enumerate(self.top) if not all(map(math.isfinite, step.values()))}
        bad |= {("prefill", i) for i, lp in enumerate(self.prefill_logprobs) if not math.isfinite(lp)}
        bad |= {("prefill", i) for i, step in enumerate(self.prefill_top) if not all(map(math.isfinite, step.values()))}
        return bad


@dataclass(frozen=True)
class PromptDrift:
    """How one prompt's candidate output differs from the reference's (None: not computable)."""

    first_divergence: int | None  # decode position, None when the tokens agree throughout
    close: bool  # the divergent tokens are in each other's top-k (True when none diverged)
    mean_abs_dlogprob: float | None  # chosen token, over the common decode prefix (None: no common prefix)
    mean_kl: float | None  # prefill, mean over the varying (prompt and answer) positions
    max_kl: float | None
    argmax_agreement: float  # prefill, share of varying positions whose top token agrees
    max_abs_dlogprob: float | None  # prefill, the sequence's own token
    finite: bool  # every logprob of both arms is finite; when not, the numbers above are None
    answer_kl: float | None = None  # mean over the answer positions
    prompt_kl: float | None = None  # mean over the varying prompt positions
    shared_kl: float | None = None  # mean over the shared header's positions (not scored)
    answer_positions: int = 0
    prompt_positions: int = 0
    shared_positions: int = 0
    nonfinite_positions: int = 0  # decode steps and prefill positions where either arm had a non-finite logprob
    # The largest per-position KLs of the scored positions, descending, at most TAIL_KEPT: the tail
    # rule counts the positions past the control's maximum (a row stored without them has max_kl).
    top_kls: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "top_kls": list(self.top_kls)}


def pack(output: ArmOutput) -> dict[str, Any]:
    """The JSON a sample stores; a NaN logprob (as the server sends it) is stored as null."""

    def safe(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {
        "tokens": list(output.tokens),
        "logprobs": [safe(x) for x in output.logprobs],
        "top": [[[t, safe(lp)] for t, lp in step.items()] for step in output.top],
        "prefill_top": [[[t, safe(lp)] for t, lp in step.items()] for step in output.prefill_top],
        "prefill_logprobs": [safe(x) for x in output.prefill_logprobs],
    }


def unpack(data: Mapping[str, Any]) -> ArmOutput:
    """`pack`'s inverse; a stored output without the prefill pass (older rows) has none."""

    def num(x: Any) -> float:
        return float(x) if x is not None else math.nan

    return ArmOutput(
        tokens=[int(t) for t in data["tokens"]],
        logprobs=[num(x) for x in data["logprobs"]],
        top=[{int(t): num(lp) for t, lp in step} for step in data["top"]],
        prefill_top=[{int(t): num(lp) for t, lp in step} for step in data.get("prefill_top", [])],
        prefill_logprobs=[num(x) for x in data.get("prefill_logprobs", [])],
    )


def kl_topk(reference: TopK, candidate: TopK) -> float:
    """KL(reference || candidate) over the reference's top-k tokens plus one bucket for the rest.

    A token the candidate did not list gets at most its smallest listed probability (it would
    have been listed otherwise), shared from what the candidate's list leaves over.
    """
    if not reference:
        return 0.0
    cand_probs = {token: math.exp(lp) for token, lp in candidate.items()}
    ceiling = min(cand_probs.values()) if cand_probs else 1.0
    missing = [token for token in reference if token not in cand_probs]
    spare = max(0.0, 1.0 - sum(cand_probs.values()))
    guess = min(ceiling, spare / (len(missing) + 1)) if missing else 0.0
    p = [math.exp(reference[token]) for token in reference]
    q = [cand_probs.get(token, guess) for token in reference]
    p_rest, q_rest = max(0.0, 1.0 - sum(p)), max(0.0, 1.0 - sum(q))
    total = 0.0
    for pi, qi in zip([*p, p_rest], [*q, q_rest], strict=True):
        if pi > _TINY:
            total += pi * (math.log(pi) - math.log(max(qi, _TINY)))
    return max(0.0, total)


def _argmax(top: TopK) -> int | None:
    return max(top, key=top.__getitem__) if top else None


def compare(reference: ArmOutput, candidate: ArmOutput, shared: int = 0, prompt_len: int | None = None) -> PromptDrift:
    """The decode and prefill comparison of one prompt (see the module docstring): prefill position
    i (before sequence token i + 1) is shared when i < `shared`, an answer one when i + 1 >=
    `prompt_len` (the prompt's token count; None: no answer positions)."""
    common = min(len(reference.tokens), len(candidate.tokens))
    first = next((i for i in range(common) if reference.tokens[i] != candidate.tokens[i]), None)
    if first is None and len(reference.tokens) != len(candidate.tokens):
        first = common  # one arm stopped where the other went on
    close = True
    if first is not None and first < common:
        close = candidate.tokens[first] in reference.top[first] and reference.tokens[first] in candidate.top[first]
    elif first is not None:
        close = False
    bad = len(reference.nonfinite_steps() | candidate.nonfinite_steps())
    if bad:
        return PromptDrift(first, close, None, None, None, 1.0, None, False, nonfinite_positions=bad)
    prefix = common if first is None else first
    deltas = [abs(reference.logprobs[i] - candidate.logprobs[i]) for i in range(prefix)]
    positions = min(len(reference.prefill_top), len(candidate.prefill_top))
    kls = [kl_topk(reference.prefill_top[i], candidate.prefill_top[i]) for i in range(positions)]
    answer_from = positions if prompt_len is None else max(shared, prompt_len - 1)
    varying = kls[shared:]
    agree = [_argmax(reference.prefill_top[i]) == _argmax(candidate.prefill_top[i]) for i in range(shared, positions)]
    steps = min(len(reference.prefill_logprobs), len(candidate.prefill_logprobs))
    jumps = [abs(reference.prefill_logprobs[i] - candidate.prefill_logprobs[i]) for i in range(shared, steps)]
    return PromptDrift(
        first_divergence=first,
        close=close,
        mean_abs_dlogprob=_mean(deltas) if deltas else None,
        mean_kl=_mean(varying),
        max_kl=max(varying, default=0.0),
        argmax_agreement=_mean([float(a) for a in agree]) if agree else 1.0,
        max_abs_dlogprob=max(jumps, default=0.0),
        finite=True,
        answer_kl=_mean(kls[answer_from:]),
        prompt_kl=_mean(kls[shared:answer_from]),
        shared_kl=_mean(kls[:shared]),
        answer_positions=len(kls[answer_from:]),
        prompt_positions=len(kls[shared:answer_from]),
        shared_positions=len(kls[:shared]),
        top_kls=largest(varying),
    )


def largest(values: Sequence[float]) -> tuple[float, ...]:
    """The `TAIL_KEPT` largest values, descending (what a stored row keeps of its per-position KLs)."""
    return tuple(sorted(values, reverse=True)[:TAIL_KEPT])


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0
