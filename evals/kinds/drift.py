"""The drift kind: how scoring, the sample store, diffs and pages read drift samples.

A drift sample (`evals.suites.drift`) holds the prompt's floor row and, for a candidate, its
drift row (`evals.logprob_drift.PromptDrift`), with the margins its suite ran under; the kind
hands those to `evals.drift_verdict.judge_drift`, flags a prompt good when it is finite and its
greedy decode never diverged, and orders the worst (highest KL; non-finite first) first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from evals.drift_verdict import judge_drift
from evals.kinds import Change, MetricKind, Samples
from evals.logprob_drift import compare, unpack
from evals.numbers import format_number
from evals.records import Sample

NOT_FINITE = 1e30  # a non-finite KL where a number must be stored: above any KL, and still a JSON number
# (an infinity is not); the judgement's `kl_finite` flag says it is not a KL


def display(value: float | None, details: Mapping[str, Any] | None, missing: str) -> str:
    """A KL, or "not finite" where the judgement flags it so (the stored number is a placeholder), or
    the number that decided where another path than the KL did (`headline`: a decode excess, the
    divergences, the tail count): a table must not show a KL of 0 beside a fail that decode decided."""
    if details is not None and details.get("kl_finite") is False:
        return "not finite"
    headline = (details or {}).get("headline")
    if isinstance(headline, str) and headline:
        return headline
    return format_number(value, missing=missing)


def plotted(value: float, details: Mapping[str, Any] | None) -> float | None:
    """No chart point for a non-finite KL: its stored number is a placeholder."""
    return None if (details or {}).get("kl_finite") is False else value


def _scores(samples: Samples, metric: str) -> dict[str, Any]:
    """key -> the prompt's floor and (for a candidate) drift rows, as `judge_drift` reads them."""
    fields = ("floor", "drift", "finite", "kl_tolerance", "dlogprob_tolerance", "tail_tolerance", "engine_change")
    return {key: {k: s.data[k] for k in fields if k in s.data} for key, s in samples.items() if "floor" in s.data}


def _passed(sample: Sample, metric: str) -> bool | None:
    if "floor" not in sample.data:
        return None
    drift = sample.data.get("drift")
    return bool(sample.data["finite"]) and (drift is None or (drift["close"] and drift["first_divergence"] is None))


def _severity(sample: Sample, metric: str) -> float | None:
    row = sample.data.get("drift") or sample.data.get("floor")
    if row is None:
        return None
    return NOT_FINITE if not sample.data.get("finite", True) or row["mean_kl"] is None else float(row["mean_kl"])


class DriftChange(BaseModel):
    key: str
    first_divergence: int | None = Field(description="Decode position where run b's greedy token first differs")
    close: bool = Field(description="The divergent tokens are in each other's top-k")
    mean_abs_dlogprob: float | None = Field(
        description="Chosen token, before the divergence (None: no common prefix, or not finite)"
    )
    tokens_a: list[int]
    tokens_b: list[int]


class DriftDiff(BaseModel):
    matched: int = Field(description="Prompts with a greedy output in both runs")
    diverged: int
    violations: int = Field(description="Divergences outside the close rule")
    changes: list[DriftChange] = Field(description="Violations first, then the earliest divergence")


def diff_drift(a: Samples, b: Samples, top: int = 50) -> DriftDiff:
    """Prompts whose greedy decode differs between the runs (drift samples: `data["arm"]`)."""
    keys = sorted(k for k in a.keys() & b.keys() if "arm" in a[k].data and "arm" in b[k].data)
    changes = []
    for key in keys:
        found = compare(unpack(a[key].data["arm"]), unpack(b[key].data["arm"]))
        if found.first_divergence is not None:
            changes.append(DriftChange(
                key=key, first_divergence=found.first_divergence, close=found.close,
                mean_abs_dlogprob=found.mean_abs_dlogprob,
                tokens_a=list(a[key].data["arm"]["tokens"]), tokens_b=list(b[key].data["arm"]["tokens"]),
            ))  # fmt: skip
    changes.sort(key=lambda c: (c.close, c.first_divergence, c.key))
    return DriftDiff(
        matched=len(keys), diverged=len(changes), violations=sum(1 for c in changes if not c.close),
        changes=changes[:top],
    )  # fmt: skip


def _diff(a: Samples, b: Samples, metrics: Sequence[str], top: int) -> DriftDiff:
    return diff_drift(a, b, top=top)


def _changes(d: DriftDiff) -> list[Change]:
    summary = f"{d.diverged} of {d.matched} prompts diverge, {d.violations} outside the close rule"
    return [Change(None, d.matched, d.diverged, 0, summary)]


STRIP_FULL_SCALE = 1.0  # |delta logprob| (nats) at which a token's colour is full


def token_strip(data: dict[str, Any]) -> list[dict[str, Any]]:
    """A drift sample's greedy tokens, each with its |delta logprob| against the reference arm.

    `shade` (0..1) colours the token; the first divergent position is `first`, and tokens past
    it have no delta (the arms no longer condition on the same text). A reference row (no
    comparison) shows its tokens unshaded.
    """
    arm = data.get("arm") or {}
    reference = data.get("reference") or {}
    first = (data.get("drift") or {}).get("first_divergence")
    strip = []
    for i, token in enumerate(arm.get("tokens", [])):
        mine = arm["logprobs"][i] if i < len(arm.get("logprobs", [])) else None
        theirs = reference.get("logprobs", [])[i] if i < len(reference.get("logprobs", [])) else None
        before = first is None or i < first
        delta = abs(mine - theirs) if reference and before and mine is not None and theirs is not None else None
        strip.append(
            {
                "token": token,
                "logprob": mine,
                "delta": delta,
                "shade": min(1.0, delta / STRIP_FULL_SCALE) if delta is not None else 0.0,
                "first": i == first,
                "after": first is not None and i > first,
            }
        )
    return strip


KIND = MetricKind(
    name="drift",
    direction="lower",
    items="prompts",
    scores=_scores,
    judge=judge_drift,
    diff=_diff,
    section=DriftDiff | None,
    changes=_changes,
    passed=_passed,
    severity=_severity,
    display=display,
    plotted=plotted,
    filters={"token_strip": token_strip},
)
