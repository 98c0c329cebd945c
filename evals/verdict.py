"""Verdicts: does one metric of a run hold against its baseline, and does the run?

A metric is judged by up to two checks, each from per-sample rows:

- the tolerance rule, as vLLM's CI writes it: the value must not fall below
  `baseline - tol` (absolute) or `baseline * (1 - tol)` (relative), mirrored for metrics
  where lower is better (WER);
- where a reference run with samples exists, a paired test on the items both runs
  answered (the intersection of keys; the explanation says how many matched), two-sided at
  `alpha`, which the metric's kind (`evals.kinds`) runs: exact McNemar for accuracy, a paired
  bootstrap over utterances for WER, over items for a mean.

The kind measures and pairs (`Measured`, `Paired`); `decide` turns both into the verdict.
How they combine, in this order:

1. `fail` when the tolerance is broken, at any sample size (a vLLM-compatible gate must
   never be looser than vLLM's), or when the paired test shows a significant regression
   (a significant result is evidence even from a small sample). Both reasons are given
   when both hold, with the p-value and the flips each way.
2. `no_baseline` when there is neither a baseline value nor a reference run to pair with.
   A baseline without a value but with a reference uses the reference's value on the
   matched items; a reference without any baseline is judged by the paired test alone.
3. `inconclusive` when nothing failed but the run could not have seen a regression as
   large as the tolerance allows: its minimum detectable effect (MDE, 80% power at the
   same `alpha`) exceeds the tolerance width |baseline - threshold|. The MDE is the
   paired one when a reference matched, else the unpaired one. A zero tolerance thus
   never passes, only fails or stays inconclusive. Without a tolerance rule (a reference
   but no baseline) there is no width to size the run against, and the MDE is reported.
4. `pass` otherwise.

A one-question change at 1319 items passes (the tolerance holds, McNemar p = 1), while a
drop of about 1.6 points with 60 flips fails on McNemar even though an 8-point tolerance
would let it through. The explanation is one paragraph, written once here and shown
unchanged by the API, the CLI, JUnit output and the dashboard.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

Verdict = Literal["pass", "warn", "fail", "inconclusive", "no_baseline"]
POWER = 0.8
_FLOAT_SLACK = 1e-9  # a value equal to the threshold is not failed by float rounding
_SEVERITY: dict[str, int] = {"pass": 0, "no_baseline": 1, "warn": 2, "inconclusive": 3, "fail": 4}
Details = dict[str, float | int | str | None]


@dataclass(frozen=True)
class Baseline:
    """The evals-side view of a stored baseline; `value` None means only a rule is known."""

    value: float | None
    direction: Literal["higher", "lower"]
    tolerance_kind: Literal["absolute", "relative"]
    tolerance: float
    source: str = ""

    def __post_init__(self) -> None:
        if self.tolerance < 0:
            raise ValueError(f"baseline tolerance must be >= 0, got {self.tolerance}")

    @classmethod
    def stored(
        cls, value: float | None, direction: str, tolerance_kind: str, tolerance: float, source: str = ""
    ) -> Baseline:
        """A baseline as the store and the API keep it, direction and tolerance kind as plain strings
        (anything but "lower" is higher-is-better, anything but "relative" is absolute)."""
        return cls(
            value,
            "lower" if direction == "lower" else "higher",
            "relative" if tolerance_kind == "relative" else "absolute",
            tolerance,
            source,
        )


class Judge(Protocol):
    """Judge per-item scores (key -> score) against a baseline and/or a reference's scores."""

    def __call__(
        self,
        suite: str,
        metric: str,
        candidate: Mapping[str, Any],
        baseline: Baseline | None,
        reference: Mapping[str, Any] | None = None,
        *,
        alpha: float = 0.05,
        reference_label: str = "the reference run",
    ) -> MetricJudgement: ...


@dataclass(frozen=True)
class MetricJudgement:
    suite: str
    metric: str
    verdict: Verdict
    value: float
    n: int
    baseline: float | None
    threshold: float | None
    explanation: str
    details: Details


def threshold(baseline: Baseline) -> float | None:
    """The vLLM-compatible pass line: value -/+ tol (absolute) or value * (1 -/+ tol)."""
    if baseline.value is None:
        return None
    sign = -1.0 if baseline.direction == "higher" else 1.0
    if baseline.tolerance_kind == "absolute":
        return baseline.value + sign * baseline.tolerance
    return baseline.value * (1 + sign * baseline.tolerance)


def run_verdict(judgements: Sequence[MetricJudgement]) -> str:
    """The worst metric decides: fail > inconclusive > warn > no_baseline > pass; none -> no_baseline.

    Inconclusive outranks no_baseline because it may hide a regression the tolerance
    cares about, while a missing baseline is a known gap in configuration, not in data.
    `warn` (the drift suite's "drift detected beyond the floor, within the margin") is not a
    failure: a run whose worst verdict is `warn` ends `passed`, and the warn stays visible.
    """
    if not judgements:
        return "no_baseline"
    return max((j.verdict for j in judgements), key=_SEVERITY.__getitem__)


@dataclass(frozen=True)
class Measured:
    """What a kind measured on the candidate, and how its values and widths read."""

    items: str  # what one sample is: items, utterances
    fmt: Callable[[float], str]  # a value
    fmt_width: Callable[[float], str]  # a distance between values (a tolerance, an MDE)
    value: float
    n: int
    summary: str
    unpaired_mde: Callable[[float], float]  # baseline value -> MDE
    details: Details


@dataclass(frozen=True)
class Paired:
    """What a kind's paired test found against the reference's scores on the shared items."""

    matched: int
    reference_value: float
    regressed: bool  # the observed change goes the bad way
    p_value: float
    mde: float
    summary: str
    details: Details


def check_inputs(suite: str, metric: str, samples: Mapping[str, Any], baseline: Baseline | None, want: str) -> None:
    if not samples:
        raise ValueError(f"{suite}.{metric}: no samples to judge; a run without samples is an error, not a verdict")
    if baseline is not None and baseline.direction != want:
        raise ValueError(
            f"{suite}.{metric}: the baseline says {baseline.direction} is better, but this metric is "
            f"{want}-is-better; fix the baseline's direction"
        )


def judge_ab(
    suite: str,
    metric: str,
    judge: Judge,
    control: Mapping[str, Any],
    treatment: Mapping[str, Any],
    *,
    alpha: float = 0.05,
    baseline: Baseline | None = None,
    control_label: str = "control",
) -> MetricJudgement:
    """Treatment against control on the items both arms ran, paired, by the metric kind's `judge`.

    The control plays the reference; `baseline`, when given, contributes only its
    tolerance rule, applied around the control's value (its own value is ignored).
    """
    shared = control.keys() & treatment.keys()
    if not shared:
        raise ValueError(
            f"{suite}.{metric}: the A/B arms share no items ({len(control)} control, {len(treatment)} "
            "treatment); both arms must run the same prompts"
        )
    arm = {key: treatment[key] for key in shared}
    rule = None if baseline is None else replace(baseline, value=None)
    return judge(suite, metric, arm, rule, control, alpha=alpha, reference_label=f"the {control_label} arm")


def decide(
    suite: str,
    metric: str,
    measured: Measured,
    baseline: Baseline | None,
    paired: Paired | None,
    reference_given: bool,
    reference_label: str,
    alpha: float,
) -> MetricJudgement:
    base_value = baseline.value if baseline is not None else None
    if base_value is None and paired is not None:
        base_value = paired.reference_value
    rule = None if baseline is None or base_value is None else replace(baseline, value=base_value)
    line = None if rule is None else threshold(rule)

    sentences: list[str] = []
    broken = False
    if rule is not None and line is not None:
        higher = rule.direction == "higher"
        broken = measured.value < line - _FLOAT_SLACK if higher else measured.value > line + _FLOAT_SLACK
        state = ("is below" if higher else "is above") if broken else "meets"
        origin = "baseline" if baseline is not None and baseline.value is not None else "reference"
        sentences.append(f"It {state} the threshold {measured.fmt(line)} ({_rule_text(measured, rule, origin)}).")
    elif paired is not None:
        sentences.append("No baseline tolerance applies, so the paired test alone decides.")
    vllm_rule = _vllm_rule(measured, baseline)
    if vllm_rule is not None:
        sentences.append(vllm_rule[1])

    significant = paired is not None and paired.regressed and paired.p_value < alpha
    if paired is not None:
        outcome = "no significant change"
        if paired.p_value < alpha:
            outcome = "a significant regression" if paired.regressed else "a significant improvement"
        sentences.append(
            f"Against {reference_label} on {paired.matched} of {measured.n} {measured.items} "
            f"(where it scored {measured.fmt(paired.reference_value)}): {paired.summary}; {outcome}."
        )
    elif reference_given:
        sentences.append(f"{reference_label.capitalize()} shares no items with this run, so nothing was paired.")

    mde, mde_kind = (paired.mde, "paired") if paired is not None else (None, None)
    if mde is None and base_value is not None:
        mde, mde_kind = measured.unpaired_mde(base_value), "unpaired"
    width = None if line is None or base_value is None else abs(base_value - line)

    verdict: Verdict
    if broken or significant:
        verdict = "fail"
    elif line is None and paired is None:
        verdict = "no_baseline"
        if not reference_given:
            sentences.append("There is no baseline value and no reference run to judge it against.")
    elif width is not None and mde is not None and mde > width + _FLOAT_SLACK:
        verdict = "inconclusive"
    else:
        verdict = "pass"

    if mde is not None:
        size = f"At this size the smallest regression it detects is {measured.fmt_width(mde)} "
        size += f"({mde_kind}, {POWER:.0%} power, alpha {alpha:g}"
        if verdict == "inconclusive" and width is not None:
            sentences.append(
                f"{size}), more than the {measured.fmt_width(width)} the tolerance allows: add items to decide."
            )
        else:
            sentences.append(f"{size}).")

    head = f"{verdict.upper().replace('_', ' ')}: {suite} {metric} = {measured.summary}."
    details: Details = {
        "value": measured.value,
        "n": measured.n,
        **measured.details,
        "tolerance_width": width,
        "mde": mde,
        "mde_kind": mde_kind,
        "alpha": alpha,
        "power": POWER,
        "matched": paired.matched if paired is not None else 0,
        "reference_value": paired.reference_value if paired is not None else None,
        "p_value": paired.p_value if paired is not None else None,
        **(paired.details if paired is not None else {}),
        "baseline_source": baseline.source if baseline is not None else None,
        "vllm_rule": vllm_rule[0] if vllm_rule is not None else None,
    }
    return MetricJudgement(
        suite, metric, verdict, measured.value, measured.n, base_value, line, " ".join([head, *sentences]), details
    )


def _vllm_rule(measured: Measured, baseline: Baseline | None) -> tuple[str, str] | None:
    """vLLM's own CI rule, where the baseline is one (relative, higher is better): `pass`/`fail` and why.

    vLLM's lm-eval gate passes when measured >= value * (1 - rtol), with no regard to sample
    size or pairing; saying it beside kvcanary's verdict shows what the stricter checks add.
    """
    if baseline is None or baseline.value is None or baseline.tolerance_kind != "relative":
        return None
    if baseline.direction != "higher":
        return None
    line = baseline.value * (1 - baseline.tolerance)
    passed = measured.value >= line - _FLOAT_SLACK
    verb = "passed" if passed else "failed"
    return (
        "pass" if passed else "fail",
        f"vLLM's own rule (measured >= {baseline.value:g} * (1 - {baseline.tolerance:g}) = {line:.4f}) "
        f"would have {verb} it.",
    )


def _rule_text(measured: Measured, rule: Baseline, origin: str) -> str:
    sign = "-" if rule.direction == "higher" else "+"
    value = measured.fmt(rule.value or 0.0)
    if rule.tolerance_kind == "absolute":
        text = f"{origin} {value} {sign} {measured.fmt_width(rule.tolerance)} absolute"
    else:
        text = f"{origin} {value} {sign} {100 * rule.tolerance:g}% relative"
    return f"{text}; source: {rule.source}" if rule.source else text
