"""What changed between two runs of one suite, item by item.

Run `a` is the one compared against (e.g. the reference), run `b` the one under review:
"right->wrong" means right in `a` and wrong in `b`. Only items present and scored in
both runs are compared. The same extraction of per-item scores feeds the verdicts
(`correct_flags`, `word_errors`), so a diff and a verdict never disagree on an item.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from evals.logprob_drift import compare, unpack


class SampleLike(Protocol):
    """The fields of a stored sample a diff reads (`evals.suites.base.Sample` has them)."""

    @property
    def target(self) -> str: ...
    @property
    def response(self) -> str: ...
    @property
    def extracted(self) -> Mapping[str, str]: ...
    @property
    def correct(self) -> Mapping[str, bool]: ...
    @property
    def substitutions(self) -> int | None: ...
    @property
    def deletions(self) -> int | None: ...
    @property
    def insertions(self) -> int | None: ...
    @property
    def ref_words(self) -> int | None: ...
    @property
    def data(self) -> Mapping[str, Any]: ...


def correct_flags(samples: Mapping[str, SampleLike], metric: str) -> dict[str, bool]:
    """key -> correct under `metric`; samples without a flag for it are left out."""
    return {key: s.correct[metric] for key, s in samples.items() if metric in s.correct}


def word_errors(samples: Mapping[str, SampleLike]) -> dict[str, tuple[int, int]]:
    """key -> (S + D + I, reference words); samples without word counts are left out."""
    out = {}
    for key, s in samples.items():
        if s.substitutions is None or s.deletions is None or s.insertions is None or s.ref_words is None:
            continue
        out[key] = (s.substitutions + s.deletions + s.insertions, s.ref_words)
    return out


@dataclass(frozen=True)
class Flip:
    key: str
    target: str
    response_a: str
    response_b: str
    extracted_a: str | None
    extracted_b: str | None


@dataclass(frozen=True)
class AccuracyDiff:
    metric: str
    matched: int  # items scored under `metric` in both runs
    right_to_wrong: list[Flip]
    wrong_to_right: list[Flip]


def diff_accuracy(a: Mapping[str, SampleLike], b: Mapping[str, SampleLike], *, metric: str) -> AccuracyDiff:
    """Items whose `metric` flag differs between the runs, both responses side by side, by key."""
    flags_a, flags_b = correct_flags(a, metric), correct_flags(b, metric)
    keys = sorted(flags_a.keys() & flags_b.keys())
    down: list[Flip] = []
    up: list[Flip] = []
    for key in keys:
        if flags_a[key] == flags_b[key]:
            continue
        sa, sb = a[key], b[key]
        flip = Flip(key, sb.target, sa.response, sb.response, sa.extracted.get(metric), sb.extracted.get(metric))
        (down if flags_a[key] else up).append(flip)
    return AccuracyDiff(metric, len(keys), down, up)


@dataclass(frozen=True)
class WerChange:
    key: str
    target: str  # the reference transcript
    hypothesis_a: str
    hypothesis_b: str
    errors_a: int
    errors_b: int
    words: int


@dataclass(frozen=True)
class WerDiff:
    matched: int  # utterances with word counts in both runs
    worse: int  # utterances with more word errors in `b`
    better: int
    changes: list[WerChange]  # at most `top`, largest change first, rises before falls


def diff_wer(a: Mapping[str, SampleLike], b: Mapping[str, SampleLike], top: int = 50) -> WerDiff:
    """Utterances whose word errors changed most between the runs, with both hypotheses."""
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    counts_a, counts_b = word_errors(a), word_errors(b)
    keys = counts_a.keys() & counts_b.keys()
    changed = [key for key in keys if counts_a[key][0] != counts_b[key][0]]
    worse = sum(1 for key in changed if counts_b[key][0] > counts_a[key][0])

    def order(key: str) -> tuple[int, int, str]:
        delta = counts_b[key][0] - counts_a[key][0]
        return (-abs(delta), -delta, key)

    changes = [
        WerChange(
            key, b[key].target, a[key].response, b[key].response, counts_a[key][0], counts_b[key][0], counts_b[key][1]
        )
        for key in sorted(changed, key=order)[:top]
    ]
    return WerDiff(len(keys), worse, len(changed) - worse, changes)


@dataclass(frozen=True)
class DriftChange:
    key: str
    first_divergence: int | None  # decode position where run b's greedy token first differs
    close: bool  # the divergent tokens are in each other's top-k
    mean_abs_dlogprob: float | None  # chosen token, before the divergence (None: no common prefix, or not finite)
    tokens_a: list[int]
    tokens_b: list[int]


@dataclass(frozen=True)
class DriftDiff:
    matched: int  # prompts with a stored greedy output in both runs
    diverged: int
    violations: int  # divergences outside the close rule
    changes: list[DriftChange]  # at most `top`: violations first, then the earliest divergence


def diff_drift(a: Mapping[str, SampleLike], b: Mapping[str, SampleLike], top: int = 50) -> DriftDiff:
    """Prompts whose greedy decode differs between the runs (drift samples: `data["arm"]`)."""
    keys = sorted(k for k in a.keys() & b.keys() if "arm" in a[k].data and "arm" in b[k].data)
    changes = []
    for key in keys:
        found = compare(unpack(a[key].data["arm"]), unpack(b[key].data["arm"]))
        if found.first_divergence is not None:
            tokens = (list(a[key].data["arm"]["tokens"]), list(b[key].data["arm"]["tokens"]))
            changes.append(DriftChange(key, found.first_divergence, found.close, found.mean_abs_dlogprob, *tokens))
    changes.sort(key=lambda c: (c.close, c.first_divergence, c.key))
    return DriftDiff(len(keys), len(changes), sum(1 for c in changes if not c.close), changes[:top])
