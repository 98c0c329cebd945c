"""The invariance verdict: each condition by the drift rule against its own floor and, for an arm
that changed only its kernels, against the control arm's same condition; the worst decides.

Per condition (`ConditionResult`): the drift rule (`judge_drift`) against the condition's A/A
floor, at best `inconclusive` where that floor itself moves past the margin; for a kernel-only
arm (`engine_change` `{}`), the drift rule's paths again with the control arm's row of the same
condition in place of the floor (earlier divergence a failure), and the tail rule against the
control's largest per-position KL, at the suite's margins (a per-condition margin is widened for
engine arms only). Every headline is built from the numbers that decided it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from evals.drift_verdict import (
    DEFAULT_DLOGPROB_MARGIN,
    DEFAULT_KL_MARGIN,
    DEFAULT_TAIL_MARGIN,
    MIN_PROMPTS,
    PathOutcome,
    deciding,
    divergence,
    drift_paths,
    judge_drift,
    kernel_only,
    mean_interval,
    tails,
)
from evals.invariance import CONDITIONS, _label, _mean, where
from evals.verdict import Baseline, MetricJudgement, Verdict


@dataclass(frozen=True)
class ConditionResult:
    name: str
    verdict: Verdict
    compared: int
    divergent: int
    mean_kl: float | None  # over the prompts with finite logprobs; None: none had
    ci: tuple[float, float] | None
    floor_kl: float
    threshold: float
    max_kl: float | None
    floor_max_kl: float  # the largest per-position KL of the floor's rows
    agreement: float
    violations: int
    floor_violations: int
    nonfinite: int
    first: str | None  # the earliest first divergence, in words, with its prompt
    firsts: list[str]
    notes: list[str]
    # The drift rule's prefill-KL and decode paths: the decode |delta logprob| excess over the
    # floor with its interval (None below the prompts an interval needs) and each path's verdict,
    # because a condition can fail on decode logprobs alone, where no KL and no argmax moved.
    decode: tuple[float | None, float | None, float | None]
    decode_verdict: str | None
    kl_verdict: str | None
    decode_margin: float
    # The floor's own mean KL interval (90%; None below the prompts an interval needs). A floor
    # past the tolerance means the arm does not reproduce itself under the condition, which a bug
    # on both sides of the floor (a batch-dependent page read) looks like: such a condition is at
    # best inconclusive, as no excess over that floor can show the arm within the tolerance.
    floor_ci: tuple[float, float] | None
    unsteady_floor: bool  # the floor's interval lies past the tolerance
    # Against the control arm (a kernel-only arm): the drift rule's paths with the control arm's same
    # condition in place of the floor, then the tail rule against the control's largest per-position
    # KL; `basis` says why they were not applied where they were not.
    checks: tuple[PathOutcome, ...] = ()
    basis: str = ""
    decided_by: PathOutcome | None = None  # the check that decided, where one was worse than the floor rule

    def headline(self) -> str:
        """The condition in one line, from the numbers that decided it."""
        label = _label(self.name)
        if self.nonfinite:
            return f"{label}: {self.nonfinite} of {self.compared} prompts have non-finite logprobs"
        moved = ""
        if self.divergent:
            moved = (
                f"{self.divergent} of {self.compared} prompts diverge, first at {self.first}, max KL "
                f"{_fmt(self.max_kl)} against its floor's {_fmt(self.floor_max_kl)}"
            )
        if self.decided_by is not None:
            return f"{label}: {moved}; {self.decided_by.sentence}" if moved else f"{label}: {self.decided_by.sentence}"
        if moved:
            return f"{label}: {moved}"
        excess, _low, high = self.decode
        if self.decode_verdict == "fail" and self.kl_verdict != "fail" and excess is not None and high is not None:
            return (
                f"{label}: decode |delta logprob| {excess:.3g} nats over its floor, to {high:.3g}, against the margin "
                f"{self.decode_margin:.3g}; no argmax moved"
            )
        return f"{label}: mean KL {self.mean_kl:.3g} nats over its floor's {self.floor_kl:.3g}, no argmax changed"

    def short(self) -> str:
        """The deciding number, as a table shows it."""
        if self.decided_by is not None:
            return f"{self.name}: {self.decided_by.headline} vs control"
        excess = self.decode[0]
        if self.decode_verdict == "fail" and self.kl_verdict != "fail" and excess is not None:
            return f"{self.name}: decode |dlp| +{excess:.3g}"
        return ""

    def sentence(self, tolerance: float) -> str:
        info = CONDITIONS.get(self.name)
        if self.mean_kl is None or self.ci is None:
            kl = "mean KL not finite (no prompt has finite logprobs)"
        else:
            over = f" over its {self.compared - self.nonfinite} finite prompts" if self.nonfinite else ""
            ci = f"95% CI {self.ci[0]:.3g}-{self.ci[1]:.3g}, clustered by prompt"
            kl = f"mean KL {self.mean_kl:.3g} nats{over} ({ci})"
        text = (
            f"{info.label if info else self.name} ({self.verdict}; {info.compares if info else ''}): "
            f"{self.compared} prompts, {kl} against its floor {self.floor_kl:.3g} + tolerance {tolerance:.3g} "
            f"(floor: {info.floor if info else 'measured'}), max KL "
            f"{'not finite' if self.max_kl is None else f'{self.max_kl:.3g}'} (floor {self.floor_max_kl:.3g}), "
            f"argmax agreement {self.agreement:.4f}, {self.divergent} diverge"
        )
        if self.firsts:
            text += f" (first divergent positions {', '.join(self.firsts[:4])})"
        text += f", {self.violations} outside the close rule (floor {self.floor_violations})"
        excess, low, high = self.decode
        if excess is not None:
            interval = (
                f"90% CI {low:.3g}-{high:.3g}"
                if low is not None and high is not None
                else "too few prompts for an interval"
            )
            margin = f"margin {self.decode_margin:.3g}"
            text += f", decode |delta logprob| {excess:.3g} nats over the floor ({interval}; {margin})"
        if self.nonfinite:
            text += f", {self.nonfinite} with non-finite logprobs"
        if self.unsteady_floor and self.floor_ci is not None:  # the check narrows floor_ci for mypy
            text += (
                f", and its floor itself moves {self.floor_kl:.3g} nats (90% CI {self.floor_ci[0]:.3g}-"
                f"{self.floor_ci[1]:.3g}), past the tolerance: the arm does not reproduce itself here"
            )
        if self.checks:
            text += "; against the control arm (" + "; ".join(f"{c.verdict}: {c.sentence}" for c in self.checks) + ")"
        elif self.basis:
            text += f"; {self.basis}"
        return text + "".join(f"; {note}" for note in self.notes)


def _fmt(x: float | None) -> str:
    return "not finite" if x is None else f"{x:.3g}"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _against_control(
    name: str, rows: Mapping[str, Mapping[str, Any]], kernel: bool, margins: tuple[float, float, float], alpha: float
) -> tuple[tuple[PathOutcome, ...], str]:
    """The control checks of one condition (and why none, where none): the drift rule's paths with the
    control arm's same condition as the baseline, then the tail rule against the control's largest
    per-position KL (its condition and its floor)."""
    if not kernel:
        return (), ""  # the explanation says once that this arm is judged by the floor rule alone
    kl_margin, dlp_margin, tail_margin = margins
    if name == "arm":  # this arm against the control, over the control's A/A floor: the drift suite's case
        floors = [(r["drift"], r["floor"]) for r in rows.values()]
        against = "the control arm's A/A floor"
        drifts, baseline = [d for d, _f in floors], [f for _d, f in floors]
        found = [divergence(floors, alpha, strict=True, against=against),
                 tails(drifts, baseline, tail_margin, alpha, against=against)]  # fmt: skip
        return tuple(replace(c, name=f"control_{c.name or 'divergence'}") for c in found), ""
    paired = [(r["drift"], r["control"]["drift"]) for r in rows.values() if r.get("control")]
    if not paired:
        return (), "the control arm built no such condition for these prompts, so nothing was held against it"
    against = "the control arm's same condition"
    checks = drift_paths(paired, kl_margin, dlp_margin, alpha, strict=True, against=against)
    reference = [c for r in rows.values() if r.get("control") for c in (r["control"]["drift"], r["control"]["floor"])]
    checks.append(tails([d for d, _c in paired], reference, tail_margin, alpha, against="the control arm"))
    return tuple(replace(c, name=f"control_{c.name}") for c in checks), ""


def _condition(
    suite: str, metric: str, name: str, rows: Mapping[str, Mapping[str, Any]], lens: Mapping[str, int],
    margins: tuple[float, float, float], kernel: bool, baseline: Baseline | None, alpha: float,
) -> ConditionResult:  # fmt: skip
    """One condition judged by the drift rule against its own floor and, for a kernel-only arm, against
    the control arm's same condition (rows: key -> stored row; margins: KL, decode, tail)."""
    tolerance, dlogprob_tolerance, tail_tolerance = margins
    shaped = {
        key: {"drift": r["drift"], "floor": r["floor"], "finite": r["drift"]["finite"], "kl_tolerance": tolerance,
              "dlogprob_tolerance": dlogprob_tolerance, "tail_tolerance": tail_tolerance}
        for key, r in rows.items()
    }  # fmt: skip
    judged = judge_drift(suite, f"{metric}.{name}", shaped, baseline, alpha=alpha)
    drifts = {key: r["drift"] for key, r in rows.items()}
    divergent = sorted(
        ((key, d["first_divergence"]) for key, d in drifts.items() if d["first_divergence"] is not None),
        key=lambda item: (item[1], item[0]),
    )
    finite = [d for d in drifts.values() if d["finite"]]
    kls = [d["mean_kl"] for d in finite]
    floor_kl = _mean([r["floor"]["mean_kl"] for r in rows.values()])
    floor_kls = [r["floor"]["mean_kl"] for r in rows.values() if r["floor"]["finite"]]
    floor_ci = mean_interval(floor_kls, confidence=1 - 2 * alpha) if len(floor_kls) >= MIN_PROMPTS else None
    margin = baseline.tolerance if baseline is not None else tolerance
    unsteady = floor_ci is not None and floor_ci[0] > margin
    verdict: Verdict = judged.verdict
    if unsteady and verdict in ("pass", "warn"):
        verdict = "inconclusive"  # an excess within the margin of a floor that moves past it means nothing
    checks, basis = _against_control(name, rows, kernel, (margin, dlogprob_tolerance, tail_tolerance), alpha)
    decided_by = None
    if checks and _RANK[deciding(checks).verdict] > _RANK[verdict]:
        decided_by = deciding(checks)
        verdict = decided_by.verdict
    notes = sorted({str(r["note"]) for r in rows.values() if r.get("note")})
    firsts = [f"{key}@{where(pos, lens[key])}" for key, pos in divergent]
    return ConditionResult(
        name=name,
        verdict=verdict,
        compared=len(rows),
        divergent=len(divergent),
        mean_kl=_mean(kls) if kls else None,
        ci=mean_interval(kls, confidence=1 - alpha) if kls else None,
        floor_kl=floor_kl,
        threshold=floor_kl + margin,
        max_kl=max((d["max_kl"] for d in finite), default=None),
        floor_max_kl=max((r["floor"]["max_kl"] or 0.0 for r in rows.values() if r["floor"]["finite"]), default=0.0),
        agreement=_mean([d["argmax_agreement"] for d in drifts.values()]),
        violations=sum(1 for d in drifts.values() if not d["close"]),
        floor_violations=sum(1 for r in rows.values() if not r["floor"]["close"]),
        nonfinite=sum(1 for d in drifts.values() if not d["finite"]),
        first=where(divergent[0][1], lens[divergent[0][0]]) if divergent else None,
        firsts=firsts,
        notes=notes,
        decode=(_number(judged.details.get("dlogprob_excess")), _number(judged.details.get("dlogprob_ci_low")),
                _number(judged.details.get("dlogprob_ci_high"))),
        decode_verdict=_text(judged.details.get("dlogprob_verdict")),
        kl_verdict=_text(judged.details.get("kl_verdict")),
        decode_margin=dlogprob_tolerance,
        floor_ci=floor_ci,
        unsteady_floor=unsteady,
        checks=checks,
        basis=basis,
        decided_by=decided_by,
    )  # fmt: skip


_RANK: dict[str, int] = {"pass": 0, "no_baseline": 1, "warn": 2, "inconclusive": 3, "fail": 4}


def _margins(rows: Mapping[str, Any], name: str, kernel: bool) -> tuple[float, float, float]:
    """A condition's KL, decode and tail margins: its own where the profile sets one, else the
    suite's. A per-condition margin is widened for an honest engine change (CUDA graphs), so an arm
    that changed only its kernels is held to the suite's margin where the condition's is wider."""
    kl_default = float(rows.get("kl_tolerance", DEFAULT_KL_MARGIN))
    dlp_default = float(rows.get("dlogprob_tolerance") or DEFAULT_DLOGPROB_MARGIN)
    kl = float((rows.get("tolerances") or {}).get(name, kl_default))
    dlp = float((rows.get("dlogprob_tolerances") or {}).get(name, dlp_default))
    if kernel:
        kl, dlp = min(kl, kl_default), min(dlp, dlp_default)
    return kl, dlp, float(rows.get("tail_tolerance") or DEFAULT_TAIL_MARGIN)


def judge_invariance(
    suite: str,
    metric: str,
    candidate: Mapping[str, Any],
    baseline: Baseline | None,
    reference: Mapping[str, Any] | None = None,
    *,
    alpha: float = 0.05,
    reference_label: str = "the reference run",
) -> MetricJudgement:
    """Every condition's verdict from per-prompt rows (key -> {conditions, prompt_len, tolerances}).

    A condition fails, passes or is inconclusive by the drift rule against its own floor; a
    condition that could not be built for a prompt is skipped with its reason, and one skipped for
    every prompt is named as such. The worst condition decides; the value is the mean KL of the
    condition that decided (the largest mean KL when all pass).
    """
    del reference, reference_label  # floors and the control arm's outputs travel with each row
    if not candidate:
        raise ValueError(f"{suite}.{metric}: no samples to judge; a run without samples is an error, not a verdict")
    names = list(dict.fromkeys([*CONDITIONS, *(c for r in candidate.values() for c in r["conditions"])]))
    kernel = kernel_only(candidate.values())
    lens = {key: int(r["prompt_len"]) for key, r in candidate.items()}
    results: list[ConditionResult] = []
    skips: list[str] = []
    tolerances: dict[str, float] = {}
    for name in names:
        found = {key: r["conditions"][name] for key, r in sorted(candidate.items()) if name in r["conditions"]}
        built = {key: r for key, r in found.items() if "skipped" not in r}
        reasons: dict[str, int] = {}
        for r in found.values():
            if "skipped" in r:
                reasons[r["skipped"]] = reasons.get(r["skipped"], 0) + 1
        label = _label(name)
        skips += [f"{label} for {n} of {len(found)} prompts: {why}" for why, n in reasons.items()]
        if built:
            margins = _margins(next(iter(candidate.values())), name, kernel)
            tolerances[name] = margins[0]
            results.append(_condition(suite, metric, name, built, lens, margins, kernel, baseline, alpha))
    details: dict[str, float | int | str | None] = {"n": len(candidate), "alpha": alpha}
    for r in results:
        details.update({f"{r.name}.verdict": r.verdict, f"{r.name}.prompts": r.compared,
                        f"{r.name}.mean_kl": r.mean_kl,
                        f"{r.name}.ci_low": r.ci and r.ci[0], f"{r.name}.ci_high": r.ci and r.ci[1],
                        f"{r.name}.floor_mean_kl": r.floor_kl, f"{r.name}.max_kl": r.max_kl,
                        f"{r.name}.argmax_agreement": r.agreement, f"{r.name}.divergent": r.divergent,
                        f"{r.name}.first_divergence": r.first, f"{r.name}.dlogprob_excess": r.decode[0],
                        f"{r.name}.dlogprob_ci_low": r.decode[1], f"{r.name}.dlogprob_ci_high": r.decode[2],
                        f"{r.name}.dlogprob_verdict": r.decode_verdict,
                        f"{r.name}.floor_ci_low": r.floor_ci and r.floor_ci[0],
                        f"{r.name}.floor_ci_high": r.floor_ci and r.floor_ci[1],
                        f"{r.name}.decided_by": r.decided_by.name if r.decided_by else "floor"})  # fmt: skip
        for check in r.checks:
            details[f"{r.name}.{check.name}_verdict"] = check.verdict
            details.update({f"{r.name}.{check.name}_{k.removeprefix('tail_')}": v for k, v in check.details.items()
                            if isinstance(v, int | float | str) or v is None})  # fmt: skip
    seconds: dict[str, float] = {}
    for r in candidate.values():
        for name, s in (r.get("seconds") or {}).items():
            seconds[name] = seconds.get(name, 0.0) + float(s)
    details.update({f"{name}.seconds": round(s, 2) for name, s in seconds.items()})
    details["skipped"] = "; ".join(skips) or None
    skipped_text = f" Skipped, each with its reason: {'; '.join(skips)}." if skips else ""
    if not results:
        explanation = f"INCONCLUSIVE: {suite} built no condition, so nothing was compared.{skipped_text}"
        return MetricJudgement(suite, metric, "inconclusive", 0.0, len(candidate), None, None, explanation, details)
    verdict: Verdict = max((r.verdict for r in results), key=_RANK.__getitem__)
    failed = [r for r in results if r.verdict == "fail"]
    worst = [r for r in results if r.verdict == verdict]
    decisive = max(worst, key=lambda r: math.inf if r.mean_kl is None else r.mean_kl - r.floor_kl)
    details.update({"failed_conditions": ",".join(r.name for r in failed) or None, "decided_by": decisive.name,
                    "ci_low": decisive.ci and decisive.ci[0], "ci_high": decisive.ci and decisive.ci[1],
                    "kl_finite": decisive.mean_kl is not None, "kernel_only": kernel,
                    "headline": (decisive.short() or None) if verdict != "pass" else None})  # fmt: skip
    if failed:
        if len(results) == 1:
            scope = "on"
        elif len(failed) == len(results):
            scope = "under every condition it built:"
        else:
            scope = "only on" if len(failed) == 1 else "on"
        what = "; ".join(r.headline() for r in failed)
        head = f"FAIL: {suite} diverges {scope} {what}."
    elif verdict == "warn":
        warned = [r for r in results if r.verdict == "warn"]
        head = (
            f"WARN: {suite} moves beyond the floor (or the control arm), within the tolerance, under "
            f"{'; '.join(r.headline() for r in warned)}: not a failure, but the math is not invariant there."
        )
    elif verdict == "inconclusive":
        unsure = [r for r in results if r.verdict == "inconclusive"]
        unsteady = [_label(r.name) for r in unsure if r.unsteady_floor]
        spread = [_label(r.name) for r in unsure if not r.unsteady_floor]
        head = f"INCONCLUSIVE: {suite} cannot decide under {'; '.join(r.headline() for r in unsure)}."
        if spread:
            head += (
                f" Under {', '.join(spread)} the prompts were too few (or too spread) to see an excess as small as "
                "the tolerance: add prompts to decide."
            )
        if unsteady:
            head += (
                f" Under {', '.join(unsteady)} the floor itself (the condition repeated) moves past the tolerance: "
                "this arm does not reproduce itself there, which a bug on both sides of the floor also looks like, "
                "and more prompts would not make a pass trustworthy; compare the arm's outputs with a control arm's "
                "(the drift suite)."
            )
    else:
        head = f"PASS: {suite} holds under every condition it built ({len(results)})."
    body = " ".join(f"{r.sentence(tolerances[r.name])}." for r in results)
    body += (
        " This arm changed its kernels alone, so each condition is also held against the control arm's same "
        "condition, with the suite's margins."
        if kernel
        else " This arm is judged against its own floors alone: its engine arguments differ from the control's, "
        "or it has no control arm."
    )
    timing = ", ".join(f"{name} {s:.1f} s" for name, s in seconds.items())
    explanation = f"{head} {body}{skipped_text}" + (f" Time per condition: {timing}." if timing else "")
    return MetricJudgement(
        suite, metric, verdict, math.inf if decisive.mean_kl is None else decisive.mean_kl, len(candidate),
        decisive.floor_kl, decisive.threshold,
        explanation, details,
    )  # fmt: skip
