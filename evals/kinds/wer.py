"""The WER kind: per-utterance word error counts, lower is better.

A sample keeps its counts in `data["wer"]` (`WordCounts`): substitutions, deletions and
insertions against the normalised reference, and its word count. Judged as the corpus WER with
a bootstrap interval over utterances and, against a reference, a paired bootstrap on the
utterances both runs transcribed; diffed as the utterances whose error counts changed most.
A sample's severity is its word errors, so pages list the worst utterances first. Words are
Whisper's English normalisation of both sides (`normalize`): the suite counts with it and the
samples page marks the same alignment (`word_marks`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from pydantic import BaseModel, Field

from evals.kinds import Change, MetricKind, Samples
from evals.records import Sample
from evals.stats import bootstrap_wer_interval, corpus_wer, paired_bootstrap_wer, wer_mde, wer_stderr
from evals.verdict import POWER, Baseline, Measured, MetricJudgement, Paired, check_inputs, decide

NAME = "wer"


class WordCounts(BaseModel):
    """One utterance's alignment against its normalised reference: the kind's per-sample data."""

    substitutions: int
    deletions: int
    insertions: int
    ref_words: int

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions


def counts(sample: Sample) -> WordCounts | None:
    """The sample's word counts; None for a sample the WER suite did not score."""
    found = sample.data.get(NAME)
    return WordCounts.model_validate(found) if found is not None else None


def api_fields(data: Mapping[str, Any]) -> dict[str, int | None]:
    """The counts as the sample API's fields (`service.schemas.SampleOut`), None where unscored."""
    found = data.get(NAME)
    if found is None:
        return dict.fromkeys((*WordCounts.model_fields, "word_errors"))
    wc = WordCounts.model_validate(found)
    return {**wc.model_dump(), "word_errors": wc.errors}


def word_errors(samples: Samples) -> dict[str, tuple[int, int]]:
    """key -> (S + D + I, reference words); samples without word counts are left out."""
    found = {key: counts(s) for key, s in samples.items()}
    return {key: (c.errors, c.ref_words) for key, c in found.items() if c is not None}


def fmt(x: float) -> str:
    return f"{100 * x:.2f}%"


def fmt_width(x: float) -> str:
    return f"{100 * x:.2f} points"


def judge_wer(
    suite: str,
    metric: str,
    candidate: Mapping[str, tuple[int, int]],
    baseline: Baseline | None,
    reference: Mapping[str, tuple[int, int]] | None = None,
    *,
    alpha: float = 0.05,
    reference_label: str = "the reference run",
) -> MetricJudgement:
    """Judge per-utterance (word errors S+D+I, reference words N) against a baseline and/or reference."""
    check_inputs(suite, metric, candidate, baseline, "lower")
    keys = sorted(candidate)  # a fixed order keeps the seeded bootstrap reproducible
    errors = [candidate[key][0] for key in keys]
    words = [candidate[key][1] for key in keys]
    value = corpus_wer(errors, words)
    low, high = bootstrap_wer_interval(errors, words, confidence=1 - alpha)
    measured = Measured(
        items="utterances",
        fmt=fmt,
        fmt_width=fmt_width,
        value=value,
        n=len(keys),
        summary=(
            f"{100 * value:.2f}% ({sum(errors)} word errors / {sum(words)} words over {len(keys)} "
            f"utterances, {1 - alpha:.0%} CI {100 * low:.2f}-{100 * high:.2f}%)"
        ),
        unpaired_mde=lambda _value: wer_mde(errors, words, alpha=alpha, power=POWER),
        details={
            "errors": sum(errors),
            "words": sum(words),
            "stderr": wer_stderr(errors, words),
            "ci_low": low,
            "ci_high": high,
        },
    )
    paired = None if reference is None else _pair(suite, metric, candidate, reference, alpha)
    return decide(suite, metric, measured, baseline, paired, reference is not None, reference_label, alpha)


def _pair(
    suite: str,
    metric: str,
    candidate: Mapping[str, tuple[int, int]],
    reference: Mapping[str, tuple[int, int]],
    alpha: float,
) -> Paired | None:
    keys = sorted(candidate.keys() & reference.keys())
    if not keys:
        return None
    for key in keys:
        if candidate[key][1] != reference[key][1]:
            raise ValueError(
                f"{suite}.{metric}: utterance {key!r} has {candidate[key][1]} reference words here but "
                f"{reference[key][1]} in the reference run; the runs scored different transcripts "
                "(data or normaliser changed), so re-run the reference before pairing"
            )
    cand = [candidate[key][0] for key in keys]
    ref = [reference[key][0] for key in keys]
    words = [candidate[key][1] for key in keys]
    test = paired_bootstrap_wer(cand, ref, words, confidence=1 - alpha)
    worse = sum(1 for c, r in zip(cand, ref, strict=True) if c > r)
    better = sum(1 for c, r in zip(cand, ref, strict=True) if c < r)
    return Paired(
        matched=len(keys),
        reference_value=corpus_wer(ref, words),
        regressed=test.delta > 0,
        p_value=test.p_value,
        mde=wer_mde(cand, words, reference_errors=ref, alpha=alpha, power=POWER),
        summary=(
            f"{worse} worse and {better} better utterances, WER change {100 * test.delta:+.2f} points "
            f"({1 - alpha:.0%} CI {100 * test.ci_low:+.2f} to {100 * test.ci_high:+.2f}), "
            f"paired bootstrap p={test.p_value:.2g}"
        ),
        details={
            "utterances_worse": worse,
            "utterances_better": better,
            "change": test.delta,
            "change_ci_low": test.ci_low,
            "change_ci_high": test.ci_high,
        },
    )


class WerChange(BaseModel):
    key: str
    target: str = Field(description="The reference transcript")
    hypothesis_a: str
    hypothesis_b: str
    errors_a: int
    errors_b: int
    words: int


class WerDiff(BaseModel):
    matched: int = Field(description="Utterances with word counts in both runs")
    worse: int
    better: int
    changes: list[WerChange] = Field(description="Largest change first, rises before falls")


def diff_wer(a: Samples, b: Samples, top: int = 50) -> WerDiff:
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
            key=key,
            target=b[key].target,
            hypothesis_a=a[key].response,
            hypothesis_b=b[key].response,
            errors_a=counts_a[key][0],
            errors_b=counts_b[key][0],
            words=counts_b[key][1],
        )
        for key in sorted(changed, key=order)[:top]
    ]
    return WerDiff(matched=len(keys), worse=worse, better=len(changed) - worse, changes=changes)


def _diff(a: Samples, b: Samples, metrics: Sequence[str], top: int) -> WerDiff | None:
    if not (word_errors(a) and word_errors(b)):
        return None
    return diff_wer(a, b, top=top)


def _changes(w: WerDiff) -> list[Change]:
    return [Change(None, w.matched, w.worse, w.better, f"{w.worse} utterances worse, {w.better} better of {w.matched}")]


def _passed(sample: Sample, metric: str) -> bool | None:
    found = counts(sample)
    return found.errors == 0 if found is not None else None


def _severity(sample: Sample, metric: str) -> float | None:
    found = counts(sample)
    return float(found.errors) if found is not None else None


def _scores(samples: Samples, metric: str) -> dict[str, Any]:
    return dict(word_errors(samples))


@cache
def _normalizer() -> Any:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def normalize(text: str) -> str:
    """Whisper's English normalisation: case, punctuation, numbers, contractions, spelling."""
    result: str = _normalizer()(text)
    return result


def word_marks(reference: str, hypothesis: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The normalised words of both sides, each with what jiwer's alignment made of it.

    Marks are jiwer's chunk types: equal, substitute, delete (reference only), insert
    (hypothesis only); so the samples page shows the very edits the S/D/I counts add up.
    """
    import jiwer

    ref_norm, hyp_norm = normalize(reference), normalize(hypothesis)
    if not ref_norm:
        return [], []
    aligned = jiwer.process_words(ref_norm, hyp_norm)
    ref_words, hyp_words = aligned.references[0], aligned.hypotheses[0]
    ref: list[tuple[str, str]] = []
    hyp: list[tuple[str, str]] = []
    for chunk in aligned.alignments[0]:
        ref += [(word, chunk.type) for word in ref_words[chunk.ref_start_idx : chunk.ref_end_idx]]
        hyp += [(word, chunk.type) for word in hyp_words[chunk.hyp_start_idx : chunk.hyp_end_idx]]
    return ref, hyp


KIND = MetricKind(
    name=NAME,
    direction="lower",
    items="utterances",
    scores=_scores,
    judge=judge_wer,
    diff=_diff,
    section=WerDiff | None,
    changes=_changes,
    passed=_passed,
    severity=_severity,
    totals={
        "word_errors": ((NAME, "substitutions"), (NAME, "deletions"), (NAME, "insertions")),
        "ref_words": ((NAME, "ref_words"),),
    },
    marks=word_marks,
)
