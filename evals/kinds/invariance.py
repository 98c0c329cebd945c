"""The invariance kind: the same tokens under serving conditions, each beside its A/A floor.

An invariance sample (`evals.suites.invariance`) keeps per condition a drift and a floor row
in `data["conditions"]`; the kind hands them to `evals.invariance_verdict.judge_invariance`, flags a
prompt bad when a condition moved its argmax where its floor did not (or outside the close
rule), orders prompts by their largest KL excess over the floor, and diffs per condition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from evals.invariance import _mean
from evals.invariance_verdict import judge_invariance
from evals.kinds import MetricKind, Samples
from evals.kinds.drift import display, plotted
from evals.records import Sample

NON_FINITE_SEVERITY = 1e30


def _scores(samples: Samples, metric: str) -> dict[str, Any]:
    """key -> the prompt's condition rows, as `judge_invariance` reads them."""
    keep = (
        "conditions",
        "prompt_len",
        "kl_tolerance",
        "tolerances",
        "dlogprob_tolerance",
        "dlogprob_tolerances",
        "tail_tolerance",
        "engine_change",
        "seconds",
    )
    return {key: {k: s.data.get(k) for k in keep} for key, s in samples.items() if "conditions" in s.data}


def _built(sample: Sample) -> list[Mapping[str, Any]]:
    return [r for r in sample.data.get("conditions", {}).values() if "skipped" not in r]


def _passed(sample: Sample, metric: str) -> bool | None:
    if "conditions" not in sample.data:
        return None
    moved = any(
        not r["drift"]["close"]
        or (r["drift"]["first_divergence"] is not None and r["floor"]["first_divergence"] is None)
        for r in _built(sample)
    )
    return bool(sample.data["finite"]) and not moved


def _severity(sample: Sample, metric: str) -> float | None:
    if "conditions" not in sample.data:
        return None
    if not sample.data.get("finite", True):
        return NON_FINITE_SEVERITY
    return max((r["drift"]["mean_kl"] - r["floor"]["mean_kl"] for r in _built(sample)), default=0.0)


class ConditionChange(BaseModel):
    condition: str
    matched: int = Field(description="Prompts this condition compared in both runs")
    diverged_a: int = Field(description="Prompts whose argmax moved under the condition where its floor's did not")
    diverged_b: int
    mean_kl_a: float
    mean_kl_b: float
    newly_diverged: list[str] = Field(description="Prompts that moved in run b only")


class InvarianceDiff(BaseModel):
    matched: int = Field(description="Prompts with condition rows in both runs")
    conditions: list[ConditionChange]


def _moved(r: Mapping[str, Any]) -> bool:
    return r["drift"]["first_divergence"] is not None and r["floor"]["first_divergence"] is None


def diff_invariance(a: Samples, b: Samples, top: int = 50) -> InvarianceDiff | None:
    """Per condition both runs built: how many prompts moved in each, and which moved in `b` only."""
    keys = sorted(k for k in a.keys() & b.keys() if "conditions" in a[k].data and "conditions" in b[k].data)
    if not keys:
        return None
    changes = []
    names = dict.fromkeys(n for k in keys for n in (*a[k].data["conditions"], *b[k].data["conditions"]))
    for name in names:
        pairs = {k: (a[k].data["conditions"].get(name), b[k].data["conditions"].get(name)) for k in keys}
        both = {k: (x, y) for k, (x, y) in pairs.items() if x and y and "skipped" not in x and "skipped" not in y}
        if not both:
            continue
        changes.append(ConditionChange(
            condition=name,
            matched=len(both),
            diverged_a=sum(1 for x, _ in both.values() if _moved(x)),
            diverged_b=sum(1 for _, y in both.values() if _moved(y)),
            mean_kl_a=_mean([x["drift"]["mean_kl"] for x, _ in both.values()]),
            mean_kl_b=_mean([y["drift"]["mean_kl"] for _, y in both.values()]),
            newly_diverged=[k for k, (x, y) in both.items() if _moved(y) and not _moved(x)][:top],
        ))  # fmt: skip
    return InvarianceDiff(matched=len(keys), conditions=changes)


def _diff(a: Samples, b: Samples, metrics: Sequence[str], top: int) -> InvarianceDiff | None:
    return diff_invariance(a, b, top=top)


KIND = MetricKind(
    name="invariance",
    direction="lower",
    items="prompts",
    scores=_scores,
    judge=judge_invariance,
    diff=_diff,
    section=InvarianceDiff | None,
    passed=_passed,
    severity=_severity,
    display=display,
    plotted=plotted,
)
