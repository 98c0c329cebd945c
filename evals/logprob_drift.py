"""Per-token comparison of two arms' logprobs, and the drift verdict against an A/A floor.

An arm's output for one prompt is its greedy tokens with the chosen token's logprob and its
top-k per step (decode path), and the top-k at every position of the reference's whole
sequence scored teacher-forced (prefill path). Two outputs compare as:

- decode: the first position where the tokens differ (None when they agree), whether the two
  tokens there are each in the other's top-k (vLLM's `check_logprobs_close` rule; a divergence
  outside it is a violation), and the mean |delta logprob| of the chosen token before it;
- prefill: per position the KL divergence of the reference's top-k distribution from the
  candidate's (the mass outside the reference's top-k in one "rest" bucket), whether the
  argmax agrees, and the largest |delta logprob| of the token the sequence actually has.

The floor is the reference compared with itself under another batch composition: what the
engine's own nondeterminism moves. The candidate is judged against it (`judge_drift`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from evals.stats import _z_alpha_power
from evals.verdict import POWER, Baseline, MetricJudgement, Verdict

TopK = Mapping[int, float]  # token id -> logprob, at one position
_TINY = 1e-12  # probability floor inside the KL so a token one arm rules out stays finite
DEFAULT_KL_TOLERANCE = 0.01  # nats of mean KL over the floor, when no baseline gives one
MIN_PROMPTS = 8  # below this many prompts the KL interval decides nothing (inconclusive, not pass or fail)


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


@dataclass(frozen=True)
class PromptDrift:
    """How one prompt's candidate output differs from the reference's."""

    first_divergence: int | None  # decode position, None when the tokens agree throughout
    close: bool  # the divergent tokens are in each other's top-k (True when none diverged)
    mean_abs_dlogprob: float  # chosen token, over the common decode prefix
    mean_kl: float  # prefill, mean over positions
    max_kl: float
    argmax_agreement: float  # prefill, share of positions whose top token agrees
    max_abs_dlogprob: float  # prefill, the sequence's own token
    finite: bool  # every logprob of both arms is finite; when not, the KL numbers are 0 (not computable)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def compare(reference: ArmOutput, candidate: ArmOutput) -> PromptDrift:
    """The decode and prefill comparison of one prompt (see the module docstring)."""
    common = min(len(reference.tokens), len(candidate.tokens))
    first = next((i for i in range(common) if reference.tokens[i] != candidate.tokens[i]), None)
    if first is None and len(reference.tokens) != len(candidate.tokens):
        first = common  # one arm stopped where the other went on
    close = True
    if first is not None and first < common:
        close = candidate.tokens[first] in reference.top[first] and reference.tokens[first] in candidate.top[first]
    elif first is not None:
        close = False
    prefix = common if first is None else first
    deltas = [abs(reference.logprobs[i] - candidate.logprobs[i]) for i in range(prefix)]
    positions = min(len(reference.prefill_top), len(candidate.prefill_top))
    kls = [kl_topk(reference.prefill_top[i], candidate.prefill_top[i]) for i in range(positions)]
    agree = [_argmax(reference.prefill_top[i]) == _argmax(candidate.prefill_top[i]) for i in range(positions)]
    steps = min(len(reference.prefill_logprobs), len(candidate.prefill_logprobs))
    jumps = [abs(reference.prefill_logprobs[i] - candidate.prefill_logprobs[i]) for i in range(steps)]
    finite = reference.finite() and candidate.finite()
    return PromptDrift(
        first_divergence=first,
        close=close,
        mean_abs_dlogprob=_mean(deltas) if finite else 0.0,
        mean_kl=_mean(kls) if finite else 0.0,
        max_kl=max(kls, default=0.0) if finite else 0.0,
        argmax_agreement=_mean([float(a) for a in agree]) if agree else 1.0,
        max_abs_dlogprob=max(jumps, default=0.0) if finite else 0.0,
        finite=finite,
    )


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def clustered_mean_interval(
    per_prompt: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap of the mean over prompts, resampling whole prompts (positions cluster in them)."""
    values = np.asarray(per_prompt, dtype=np.float64)
    if len(values) == 0:
        raise ValueError("no prompts to take an interval over")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def kl_mde(excess: Sequence[float], *, alpha: float = 0.05, power: float = POWER) -> float:
    """Smallest mean KL excess over the floor a test at `alpha` finds with `power` at this many prompts.

    From the spread of the per-prompt excess (candidate KL - floor KL); with fewer than two
    prompts nothing is detectable (infinite).
    """
    if len(excess) < 2:
        return math.inf
    k = sum(_z_alpha_power(alpha, power))
    return k * float(np.std(np.asarray(excess, dtype=np.float64), ddof=1)) / math.sqrt(len(excess))


def judge_drift(
    suite: str,
    metric: str,
    candidate: Mapping[str, Any],
    baseline: Baseline | None,
    reference: Mapping[str, Any] | None = None,
    *,
    alpha: float = 0.05,
    reference_label: str = "the reference run",
) -> MetricJudgement:
    """The drift verdict from per-prompt rows (`DRIFT.scores`): candidate drift and the A/A floor.

    `fail` when any logprob is non-finite, when more prompts break the close rule than in the
    floor, or when the upper bound of the candidate's mean KL exceeds the floor's mean KL by
    more than the tolerance (the baseline's, else the suite's `kl_tolerance`) while the run is
    large enough to see that much (its lower bound beyond it fails whatever the MDE); the KL
    rules need `MIN_PROMPTS` prompts with finite logprobs; `inconclusive` with the MDE in KL
    units when the prompts are too few; `pass` otherwise.
    The reference arm itself (no candidate comparison) is `no_baseline`, its floor reported.
    """
    del reference, reference_label  # the floor travels with each compared row
    rows = [candidate[key] for key in sorted(candidate)]
    if not rows:
        raise ValueError(f"{suite}.{metric}: no samples to judge; a run without samples is an error, not a verdict")
    n = len(rows)
    floor = [row["floor"] for row in rows]
    floor_kl = [f["mean_kl"] for f in floor]
    floor_mean = _mean(floor_kl)
    floor_violations = sum(1 for f in floor if not f["close"])
    floor_divergent = sum(1 for f in floor if f["first_divergence"] is not None)
    floor_text = (
        f"The A/A floor (the reference against itself in another batch composition) has mean KL "
        f"{floor_mean:.3g} nats, max KL {max((f['max_kl'] for f in floor), default=0.0):.3g}, "
        f"{floor_divergent} divergent and {floor_violations} close-rule violations over {n} prompts"
    )
    compared = [row["drift"] for row in rows if row.get("drift") is not None]
    nonfinite = [key for key in sorted(candidate) if not candidate[key]["finite"]]
    details: dict[str, float | int | str | None] = {
        "n": n,
        "floor_mean_kl": floor_mean,
        "floor_violations": floor_violations,
        "floor_divergent": floor_divergent,
        "nonfinite_prompts": len(nonfinite),
        "alpha": alpha,
        "power": POWER,
    }
    if not compared:
        verdict: Verdict = "fail" if nonfinite else "no_baseline"
        head = f"{verdict.upper().replace('_', ' ')}: {suite} {metric} = {floor_mean:.3g} (the A/A floor of this arm)."
        body = f"{floor_text}. This arm is the reference: nothing was compared with it."
        if nonfinite:
            body += f" {len(nonfinite)} prompts have non-finite logprobs ({', '.join(nonfinite[:5])})."
        return MetricJudgement(suite, metric, verdict, floor_mean, n, None, None, f"{head} {body}", details)

    tolerance = baseline.tolerance if baseline is not None else float(rows[0].get("kl_tolerance", DEFAULT_KL_TOLERANCE))
    scored = [(row["drift"], row["floor"]["mean_kl"]) for row in rows if row.get("drift") and row["drift"]["finite"]]
    kl = [d["mean_kl"] for d, _ in scored] or [0.0]
    value = _mean(kl)
    line = floor_mean + tolerance
    violations = sum(1 for d in compared if not d["close"])
    divergent = sorted(
        ((key, row["drift"]["first_divergence"]) for key, row in sorted(candidate.items()) if row.get("drift")),
        key=lambda item: (item[1] is None, item[1] if item[1] is not None else 0),
    )
    positions = [f"{key}@{pos}" for key, pos in divergent if pos is not None]
    agreement = _mean([d["argmax_agreement"] for d in compared])
    abs_delta = _mean([d["mean_abs_dlogprob"] for d in compared])
    low, high = clustered_mean_interval(kl, confidence=1 - alpha)
    mde = kl_mde([d["mean_kl"] - f for d, f in scored], alpha=alpha)
    summary = (
        f"mean KL {value:.3g} nats over {len(scored)} prompts with finite logprobs "
        f"({1 - alpha:.0%} CI {low:.3g}-{high:.3g}, "
        f"clustered by prompt), argmax agreement {agreement:.4f}, max |delta logprob| "
        f"{max((d['max_abs_dlogprob'] for d in compared), default=0.0):.3g}; decode: {len(positions)} prompts "
        f"diverge (first divergent positions {', '.join(positions[:8]) or 'none'}), {violations} outside the "
        f"close rule, mean |delta logprob| before divergence {abs_delta:.3g}"
    )
    reasons = []
    if nonfinite:
        reasons.append(f"{len(nonfinite)} prompts have non-finite logprobs ({', '.join(nonfinite[:5])})")
    if violations > floor_violations:
        reasons.append(f"{violations} close-rule violations exceed the floor's {floor_violations}")
    enough = len(scored) >= MIN_PROMPTS  # a bootstrap over fewer prompts has no spread to trust
    mde_short = mde <= tolerance and enough
    if low > line and enough:
        reasons.append(f"its KL lower bound {low:.3g} exceeds floor + tolerance {line:.3g}")
    elif high > line and mde_short:
        reasons.append(f"its KL upper bound {high:.3g} exceeds floor + tolerance {line:.3g}")
    if reasons:
        verdict = "fail"
        tail = "It fails: " + "; ".join(reasons) + "."
    elif not mde_short:
        verdict = "inconclusive"
        tail = (
            f"It is inconclusive: at {n} prompts the smallest KL excess over the floor it detects is {mde:.3g} "
            f"nats ({POWER:.0%} power, alpha {alpha:g}), more than the tolerance {tolerance:.3g}"
            f"{'' if enough else f' (and fewer than {MIN_PROMPTS} prompts)'}: add prompts to decide."
        )
    else:
        verdict = "pass"
        tail = (
            f"It passes: the KL upper bound {high:.3g} is within floor + tolerance {line:.3g} "
            f"(tolerance {tolerance:.3g} nats; smallest detectable excess {mde:.3g})."
        )
    head = f"{verdict.upper()}: {suite} {metric} = {summary}."
    details.update(
        {
            "value": value,
            "ci_low": low,
            "ci_high": high,
            "tolerance": tolerance,
            "threshold": line,
            "mde": mde if math.isfinite(mde) else None,
            "mde_kind": "paired",
            "violations": violations,
            "divergent": len(positions),
            "argmax_agreement": agreement,
            "mean_abs_dlogprob": abs_delta,
        }
    )
    explanation = f"{head} {floor_text}. {tail}"
    return MetricJudgement(suite, metric, verdict, value, n, floor_mean, line, explanation, details)
