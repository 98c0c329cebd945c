"""The drift verdict: is a candidate's per-token drift within its margin of the A/A floor?

Every path is judged against its own floor (the reference, the control arm, against itself in
another batch composition), per prompt and paired, with prompts as the independent units:

- prefill KL over the varying positions (`PromptDrift.mean_kl`; the shared few-shot header is
  reported apart, never scored): the excess candidate KL - floor KL per prompt, its mean's
  90% interval by a bootstrap over prompts (two one-sided tests at alpha 0.05, TOST);
- decode |delta logprob| of the chosen token before the first divergence: the same, against
  its own margin;
- decode divergence: how many prompts break vLLM's close rule where the floor's do not (and the
  reverse), an exact one-sided binomial test on those discordant prompts: under "breaks it no
  more often than the floor" it fails a run at most `alpha` of the time (5%); and how many
  diverge earlier than the floor (the same test).

How much of that decides depends on what the candidate changed (`engine_change`, stored with each
sample: the engine arguments in which its engine differs from the control's):

- **kernels only** (`{}`): a significant excess of earlier divergences is a `fail`, and the
  **tail rule** applies: the prompts with positions whose KL passes the floor's largest by more
  than `tail_tolerance` are counted, and an exact test (under "the candidate's per-prompt maxima
  are exchangeable with the floor's", at least k of m candidate maxima above all n floor maxima has
  probability C(m, k) / C(m + n, k)) fails a significant count; a count that is not significant warns.
- **engine arguments differ, or not known** (a reference run, rows stored before it was recorded):
  the floor rule alone, earlier divergence a `warn` (near-ties flip under any change of numerics,
  and such an arm's honest change is expected).

Outcomes, worst first (each path has its own; the worst decides, and names itself):
- `fail`: a non-finite logprob; the close rule broken significantly more often than the floor;
  a path's excess not shown within its margin by a run large enough to show it (interval above
  the margin, or its upper bound above it with the MDE under it); for kernel-only arms, earlier
  divergence or tail exceedances significantly more often than the floor.
- `inconclusive`: fewer than `MIN_PROMPTS` prompts, or an upper bound above the margin by a run
  too small to tell (the MDE is over the margin): add prompts.
- `warn`: equivalent within the margin, but drift is detected beyond the floor (a lower bound
  above 0, more close-rule breaks than the floor, earlier divergence or tail exceedances that
  are not significant).
- `pass`: equivalent within the margin and nothing detected beyond the floor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from evals.logprob_drift import TAIL_KEPT
from evals.stats import _z_alpha_power
from evals.verdict import POWER, Baseline, Details, MetricJudgement, Verdict

# Default margins (docs/drift.md "Calibration"), set against the GPU fixtures: the largest honest
# difference (A/A and fixed-vs-stock upper bounds) is 1.7e-5 nats of KL (TRITON_ATTN) and 8.4e-4
# of decode |delta logprob| (TRITON_MLA; 4.5e-4 on TRITON_ATTN), and bf16 vs fp32 moves the KL by
# 1.1e-3. KL: 12 times the honest difference, five times below the dtype change. Decode: 2.2
# times it on TRITON_ATTN but only 1.2 times on TRITON_MLA, where an MLA mutant moves decode by
# 1.2e-3: a wider margin would let it pass (docs/drift.md). A profile sets its own with
# `kl_tolerance` / `dlogprob_tolerance`, or a baseline's tolerance.
DEFAULT_KL_MARGIN = 2e-4  # nats of mean KL over the floor, on the varying positions
DEFAULT_DLOGPROB_MARGIN = 1e-3  # nats of mean |delta logprob| of the chosen decode token over the floor
# The tail rule's margin over the control's (or the floor's) largest per-position KL (docs/drift.md
# "The tail rule"): the largest honest per-position KL measured is 0.042 nats (TRITON_MLA, long
# context, decode vs prefill inside one arm), a mutant's 1.54; 0.1 is 2.4 times the first.
DEFAULT_TAIL_MARGIN = 0.1
MIN_PROMPTS = 8  # below this many prompts an interval decides nothing (inconclusive)
_RANK: dict[str, int] = {"pass": 0, "warn": 1, "inconclusive": 2, "fail": 3}


@dataclass(frozen=True)
class PathOutcome:
    """One path's outcome, the sentence that says why, and its numbers."""

    verdict: Verdict
    sentence: str
    details: Details
    name: str = ""  # which path: kl, dlogprob, divergence, tails (prefixed with what it was held against)
    headline: str = ""  # the deciding number, short, as a table shows it


def mean_interval(
    values: Sequence[float], *, confidence: float, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap of the mean over prompts, resampling whole prompts (positions cluster in them)."""
    array = np.asarray(values, dtype=np.float64)
    if len(array) == 0:
        raise ValueError("no prompts to take an interval over")
    rng = np.random.default_rng(seed)
    means = array[rng.integers(0, len(array), size=(resamples, len(array)))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def excess_mde(excess: Sequence[float], *, alpha: float = 0.05, power: float = POWER) -> float:
    """Smallest mean excess over the floor a test at `alpha` finds with `power` at this many prompts
    (from the spread of the per-prompt excess; infinite below two prompts)."""
    if len(excess) < 2:
        return math.inf
    k = sum(_z_alpha_power(alpha, power))
    return k * float(np.std(np.asarray(excess, dtype=np.float64), ddof=1)) / math.sqrt(len(excess))


def exceedance_p(more: int, fewer: int) -> float:
    """One-sided exact binomial p of at least `more` of `more + fewer` discordant prompts going the
    candidate's way when either way is equally likely (1.0 when none are discordant)."""
    n = more + fewer
    return math.fsum(math.comb(n, i) for i in range(more, n + 1)) / 2**n if n else 1.0


def equivalence(
    path: str, unit: str, excess: Sequence[float], margin: float, alpha: float, against: str = "the floor"
) -> PathOutcome:
    """TOST of one path's per-prompt excess over `against` (the floor) against `margin` (module docstring)."""
    n = len(excess)
    mean = math.fsum(excess) / n if n else 0.0
    if n < MIN_PROMPTS:
        return PathOutcome(
            "inconclusive",
            f"{path}: {n} prompts, fewer than the {MIN_PROMPTS} an interval needs: add prompts to decide",
            {"excess": mean if n else None},
        )
    low, high = mean_interval(excess, confidence=1 - 2 * alpha)
    mde = excess_mde(excess, alpha=alpha)
    shown = (
        f"{path}: excess over {against} {mean:.3g} {unit} ({1 - 2 * alpha:.0%} CI {low:.3g} to {high:.3g}, {n} prompts)"
    )
    details: Details = {"excess": mean, "ci_low": low, "ci_high": high, "margin": margin, "mde": _finite(mde)}
    if low > margin or (high > margin and mde <= margin):
        return PathOutcome("fail", f"{shown} is not within the margin {margin:.3g}", details)
    if high > margin:
        return PathOutcome(
            "inconclusive",
            f"{shown} reaches past the margin {margin:.3g}, and at {n} prompts the smallest excess it detects is "
            f"{mde:.3g} ({POWER:.0%} power): add prompts to decide",
            details,
        )
    if low > 0:
        return PathOutcome("warn", f"{shown} is within the margin {margin:.3g}, but above {against}", details)
    return PathOutcome("pass", f"{shown} is within the margin {margin:.3g} and not above {against}", details)


def divergence(
    compared: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
    alpha: float,
    *,
    strict: bool = False,
    against: str = "the floor",
) -> PathOutcome:
    """Close-rule breaks and earlier divergence against `against` (the floor), prompt by prompt
    (paired); with `strict` (a kernel-only arm) significantly earlier divergence fails."""
    broken = sum(1 for d, f in compared if not d["close"] and f["close"])
    floor_broken = sum(1 for d, f in compared if d["close"] and not f["close"])
    p_broken = exceedance_p(broken, floor_broken)
    first = [(_position(d), _position(f)) for d, f in compared]
    earlier = sum(1 for mine, floor in first if mine < floor)
    later = sum(1 for mine, floor in first if mine > floor)
    p_earlier = exceedance_p(earlier, later)
    shown = (
        f"decode: {broken} prompts break the close rule where {against} does not and {floor_broken} the reverse "
        f"(one-sided exact p {p_broken:.2g}); {earlier} diverge earlier than {against}, {later} later "
        f"(p {p_earlier:.2g})"
    )
    details: Details = {
        "close_broken": broken,
        "floor_close_broken": floor_broken,
        "close_p": p_broken,
        "diverge_earlier": earlier,
        "diverge_later": later,
        "earlier_p": p_earlier,
    }
    if p_broken < alpha:
        return PathOutcome("fail", f"{shown}: the close rule breaks significantly more often than {against}", details)
    if strict and p_earlier < alpha:
        return PathOutcome("fail", f"{shown}: significantly earlier than {against}, in an arm that changed only its "
                           "kernels", details)  # fmt: skip
    if broken > floor_broken or p_earlier < alpha:
        return PathOutcome("warn", f"{shown}: the decode path moved beyond {against}", details)
    return PathOutcome("pass", f"{shown}: no more than {against}", details)


def beyond_maximum_p(k: int, m: int, n: int) -> float:
    """Exact p of at least `k` of `m` candidate values above all `n` reference values when all m + n
    are exchangeable: the k largest of them all are candidates, C(m, k) / C(m + n, k)."""
    return math.comb(m, k) / math.comb(m + n, k) if k else 1.0


def position_kls(row: Mapping[str, Any]) -> list[float]:
    """A row's largest per-position KLs (`top_kls`; a row stored before them has its `max_kl`)."""
    if not row.get("finite", True):
        return []
    kept = row.get("top_kls")
    return [float(x) for x in kept] if kept else [float(row.get("max_kl") or 0.0)]


def tails(
    candidate: Sequence[Mapping[str, Any]],
    reference: Sequence[Mapping[str, Any]],
    margin: float,
    alpha: float,
    against: str = "the floor",
) -> PathOutcome:
    """The tail rule: positions whose KL passes `against`'s largest by more than `margin`, counted per
    prompt and tested with `beyond_maximum_p` (prompts, not positions, are the independent units)."""
    peak = max((max(position_kls(r), default=0.0) for r in reference), default=0.0)
    over = [[x for x in position_kls(r) if x > peak + margin] for r in candidate]
    prompts, positions = sum(1 for o in over if o), sum(len(o) for o in over)
    at_least = "at least " if any(len(o) == TAIL_KEPT for o in over) else ""
    largest = max((max(position_kls(r), default=0.0) for r in candidate), default=0.0)
    p = beyond_maximum_p(prompts, len(candidate), len(reference))
    shown = (
        f"tails: {prompts} of {len(candidate)} prompts have positions past {against}'s largest per-position KL "
        f"{peak:.3g} nats by more than {margin:.3g} ({at_least}{positions} positions, the largest {largest:.3g}; "
        f"exact p {p:.2g} against {len(reference)} prompts of {against})"
    )
    details: Details = {"tail_prompts": prompts, "tail_positions": positions, "tail_peak": peak,
                        "tail_largest": largest, "tail_p": p, "tail_margin": margin}  # fmt: skip
    headline = f"{prompts} prompts past the max"
    if p < alpha:
        return PathOutcome("fail", f"{shown}: significantly more than {against}", details, "tails", headline)
    if prompts:
        return PathOutcome("warn", f"{shown}: not significant", details, "tails", headline)
    return PathOutcome("pass", f"{shown}: none", details, "tails", headline)


def drift_paths(
    compared: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
    kl_margin: float,
    dlp_margin: float,
    alpha: float,
    *,
    strict: bool,
    against: str = "the floor",
) -> list[PathOutcome]:
    """The prefill KL, decode |delta logprob| and divergence paths of (candidate, baseline) row pairs,
    each named and with its headline number (the excess over `against`, or the divergences)."""
    finite = [(d, f) for d, f in compared if d["finite"] and f["finite"]]
    kl_excess = [d["mean_kl"] - f["mean_kl"] for d, f in finite]
    dlp_excess = [
        d["mean_abs_dlogprob"] - (f["mean_abs_dlogprob"] or 0.0)
        for d, f in finite
        if d["mean_abs_dlogprob"] is not None
    ]
    kl = equivalence("prefill KL", "nats", kl_excess, kl_margin, alpha, against)
    dlp = equivalence("decode |delta logprob|", "nats", dlp_excess, dlp_margin, alpha, against)
    div = divergence(compared, alpha, strict=strict, against=against)
    earlier, total = div.details["diverge_earlier"], len(compared)
    return [
        replace(kl, name="kl", headline=f"KL {_signed(kl.details['excess'])}"),
        replace(dlp, name="dlogprob", headline=f"decode |dlp| {_signed(dlp.details['excess'])}"),
        replace(div, name="divergence", headline=f"{earlier} of {total} diverge earlier"),
    ]


def deciding(paths: Sequence[PathOutcome]) -> PathOutcome:
    """The path that decides: the first of the worst verdict."""
    worst = max(_RANK[p.verdict] for p in paths)
    return next(p for p in paths if _RANK[p.verdict] == worst)


def kernel_only(rows: Iterable[Mapping[str, Any]]) -> bool:
    """The candidate changed its kernels alone: every row's stored `engine_change` is empty (False
    when its engine arguments differ, or when that is not known)."""
    changes = [r.get("engine_change") for r in rows]
    return bool(changes) and all(c == {} for c in changes)


def engine_change_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """What the candidate changed besides its kernels, in words."""
    changes = [r.get("engine_change") for r in rows]
    if changes and all(c == {} for c in changes):
        return "kernels only"
    found = next((c for c in changes if c), None)
    if not found:
        return "not known (judged by the floor rule alone)"
    return "engine arguments " + ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in sorted(found.items()))


def _position(row: Mapping[str, Any]) -> float:
    found = row["first_divergence"]
    return math.inf if found is None else float(found)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def kl_value(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The metric's value: mean KL over the varying positions, per prompt then over prompts; None
    (not finite) when any prompt has a non-finite logprob."""
    if any(not row["finite"] for row in rows):
        return None
    return _mean([row["mean_kl"] for row in rows]) or 0.0


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
    """The drift verdict from per-prompt rows (`DRIFT.scores`: floor, drift, finite, margins).

    The KL margin is the baseline's tolerance when one is given, else the rows' `kl_tolerance`.
    The reference arm itself (no candidate comparison) is `no_baseline` (or `fail` when not
    finite), its floor reported.
    """
    del reference, reference_label  # the floor travels with each compared row
    keys = sorted(candidate)
    if not keys:
        raise ValueError(f"{suite}.{metric}: no samples to judge; a run without samples is an error, not a verdict")
    rows = [candidate[key] for key in keys]
    floors = [row["floor"] for row in rows]
    compared = [(key, row["drift"], row["floor"]) for key, row in zip(keys, rows, strict=True) if row.get("drift")]
    judged = [d for _key, d, _f in compared] or floors
    nonfinite = [key for key, row in zip(keys, rows, strict=True) if not row["finite"]]
    value = kl_value(judged)
    floor_value = kl_value(floors)
    details: Details = {
        "n": len(rows),
        "value": value,
        "kl_finite": value is not None,
        "floor_mean_kl": floor_value,
        "nonfinite_prompts": len(nonfinite),
        "nonfinite_positions": sum(int(d.get("nonfinite_positions", 0)) for d in judged),
        "answer_kl": _mean([d["answer_kl"] for d in judged if d.get("answer_kl") is not None]),
        "prompt_kl": _mean([d["prompt_kl"] for d in judged if d.get("prompt_kl") is not None]),
        "shared_kl": _mean([d["shared_kl"] for d in judged if d.get("shared_kl") is not None]),
        "alpha": alpha,
        "power": POWER,
    }
    kl_text = "not finite" if value is None else f"{value:.3g} nats"
    nonfinite_text = (
        f"{len(nonfinite)} of {len(rows)} prompts have non-finite logprobs at {details['nonfinite_positions']} "
        f"positions ({', '.join(nonfinite[:5])}), so their KL is not finite"
    )
    floor_text = (
        f"The A/A floor (the reference against itself in another batch composition): mean KL "
        f"{'not finite' if floor_value is None else f'{floor_value:.3g} nats'}, "
        f"{sum(1 for f in floors if f['first_divergence'] is not None)} divergent and "
        f"{sum(1 for f in floors if not f['close'])} close-rule violations over {len(rows)} prompts"
    )
    if not compared:
        verdict: Verdict = "fail" if nonfinite else "no_baseline"
        body = f"{floor_text}. This arm is the reference: nothing was compared with it."
        if nonfinite:
            body += f" {nonfinite_text}."
        head = f"{verdict.upper().replace('_', ' ')}: {suite} {metric} = {kl_text} (the A/A floor of this arm)."
        shown = value if value is not None else math.inf
        return MetricJudgement(suite, metric, verdict, shown, len(rows), floor_value, None, f"{head} {body}", details)

    kl_margin = baseline.tolerance if baseline is not None else float(rows[0].get("kl_tolerance", DEFAULT_KL_MARGIN))
    dlp_margin = float(rows[0].get("dlogprob_tolerance", DEFAULT_DLOGPROB_MARGIN))
    tail_margin = float(rows[0].get("tail_tolerance", DEFAULT_TAIL_MARGIN))
    strict = kernel_only(rows)
    pairs = [(d, f) for _key, d, f in compared]
    paths = drift_paths(pairs, kl_margin, dlp_margin, alpha, strict=strict)
    if strict:
        paths.append(tails([d for d, _f in pairs], [f for _d, f in pairs], tail_margin, alpha))
    finite = [(d, f) for d, f in pairs if d["finite"] and f["finite"]]
    decided = deciding(paths)
    verdict = "fail" if nonfinite else decided.verdict
    for path in paths:
        if path.name in ("divergence", "tails"):
            details.update(path.details)
        else:
            details.update({f"{path.name}_{k}": v for k, v in path.details.items()})
        details[f"{path.name}_verdict"] = path.verdict
    quiet = nonfinite or verdict == "pass" or decided.name == "kl"  # the KL itself is the headline then
    details.update({"tolerance": kl_margin, "dlogprob_tolerance": dlp_margin, "mde_kind": "paired",
                    "kernel_only": strict, "decided_by": "nonfinite" if nonfinite else decided.name,
                    "headline": None if quiet else decided.headline})  # fmt: skip
    positions = [f"{key}@{d['first_divergence']}" for key, d, _f in compared if d["first_divergence"] is not None]
    summary = (
        f"mean KL {kl_text} over the varying positions of {len(finite)} prompts with finite logprobs (answer "
        f"positions {_fmt(details['answer_kl'])}, varying prompt positions {_fmt(details['prompt_kl'])}; the shared "
        f"header, not scored, {_fmt(details['shared_kl'])}); {len(positions)} prompts diverge "
        f"({', '.join(positions[:8]) or 'none'})"
    )
    change = engine_change_text(rows)
    rule = (
        "so earlier divergence and the tail rule count against it"
        if strict
        else "so it is judged by the floor rule alone (its honest change is expected)"
    )
    reasons = [nonfinite_text] if nonfinite else []
    reasons += [p.sentence for p in paths]
    closing = {
        "fail": "It fails",
        "inconclusive": "It is inconclusive",
        "warn": "It warns (drift beyond the floor, within the margin; not a failure)",
        "pass": "It passes (equivalent within the margins)",
    }[verdict]
    if verdict == "pass":
        head = f"PASS: {suite} {metric} = {summary}."
    else:
        because = nonfinite_text if nonfinite else decided.sentence
        head = f"{verdict.upper()}: {suite} {metric}, decided by {because}. Over all prompts: {summary}."
    explanation = (
        f"{head} {floor_text}. What the candidate changed: {change}, {rule}. {closing}: " + "; ".join(reasons) + "."
    )
    threshold = (floor_value or 0.0) + kl_margin
    shown = value if value is not None else math.inf  # never 0: a NaN model has no KL at all
    return MetricJudgement(suite, metric, verdict, shown, len(rows), floor_value, threshold, explanation, details)


def _signed(x: Any) -> str:
    return "-" if x is None else f"{x:+.3g}"


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"
