"""Every metric kind ships both dashboard partials, and each renders a stored sample and a run diff.

The samples page and the run page import `samples/<kind>.html` for the kind of a suite's primary
metric, and the compare page includes `diff/<kind>.html` for each kind a suite reports: a kind
without one breaks those pages for any suite that uses it (`mean` and `corpus` had no samples
partial). The partials are rendered here through the dashboard's own template environment, the
way those pages call them, with samples and diffs the kinds themselves compute.
"""

from __future__ import annotations

from typing import Any

import pytest

from evals import kinds
from evals.invariance import row, skipped
from evals.kinds import MetricKind
from evals.logprob_drift import PromptDrift
from evals.records import Sample
from service.dashboard.render import TEMPLATES
from service.dashboard.views import SuiteCount
from service.schemas import Page, SampleOut
from tests.service.test_compare import drift_output, drift_sample

BLEU = "wmt16-en-de:bleu,none"
# Each kind's metric and one item's data under it, as its suite stores them (accuracy: a flag).
METRIC: dict[str, str] = {
    "accuracy": "exact_match", "wer": "wer", "mean": "f1", "corpus": BLEU, "drift": "kl", "invariance": "kl"
}  # fmt: skip
REFERENCE = drift_output([10, 20, 30, 40], -0.1)


def _drift(kl: float, first: int | None = None) -> PromptDrift:
    return PromptDrift(first, True, 0.0, kl, kl, 1.0, 0.0, True)


def _conditions(worse: int) -> dict[str, Any]:
    moved = (
        row((_drift(0.4, first=13), 9), (_drift(0.001), 9)) if worse else row((_drift(0.001), 9), (_drift(0.001), 9))
    )
    conditions = {"prefix_hit": moved, "long_context": skipped("the engine serves without prefix caching")}
    return {"conditions": conditions, "prompt_len": 10, "finite": True, "kl_tolerance": 0.01, "tokens": [1, 2]}


DATA: dict[str, Any] = {
    "drift": lambda worse: (
        drift_sample("x", drift_output([10, 25, 99, 98] if worse else [10, 20, 30, 40], -0.1), REFERENCE).data
    ),
    "invariance": _conditions,
    "wer": lambda worse: {"wer": {"substitutions": worse, "deletions": 0, "insertions": 0, "ref_words": 4}},
    "mean": lambda worse: {"mean": {"f1": 0.9 - 0.5 * worse}},
    "corpus": lambda worse: {"corpus": {BLEU: ["the cat sat down", "the dog sat" if worse else "the cat sat down"]}},
}
SAMPLES_VIEW = (
    '{% import "samples/" ~ kind ~ ".html" as view with context %}'
    "{{ view.summary(count) }}{% if view.brief is defined %}{{ view.brief(count) }}{% endif %}"
    "<table>{{ view.table(listing) }}</table>"
)
DIFF_VIEW = '{% include "diff/" ~ kind ~ ".html" %}'


def _sample(kind: str, key: str, worse: int) -> Sample:
    data = DATA[kind](worse) if kind in DATA else {}
    correct = {METRIC["accuracy"]: not worse} if kind == "accuracy" else {}
    return Sample(key=key, prompt_hash="h", prompt=f"Question: item {key}?\nAnswer:", target="the cat sat down",
                  response="the dog sat" if worse else "the cat sat down", correct=correct, data=data)  # fmt: skip


def _stored(kind: MetricKind, sample: Sample) -> SampleOut:
    metric = METRIC[kind.name]
    return SampleOut(
        arm="fixed", suite="s", key=sample.key, prompt_hash=sample.prompt_hash, prompt=sample.prompt,
        target=sample.target, response=sample.response, extracted={}, correct=dict(sample.correct),
        is_correct=kind.passed(sample, metric), error=None, data=dict(sample.data),
        severity=kind.severity(sample, metric),
    )  # fmt: skip


@pytest.mark.parametrize("kind", list(kinds.registry().values()), ids=lambda k: k.name)
def test_every_kind_renders_a_samples_view(kind: MetricKind) -> None:
    samples = [_sample(kind.name, "q1", 1), _sample(kind.name, "q0", 0)]
    listing = Page[SampleOut](items=[_stored(kind, s) for s in samples], total=2, offset=0, limit=50)
    count = SuiteCount("fixed", "s", kind.name, 2, 1, dict.fromkeys(kind.totals, 0))
    html = TEMPLATES.env.from_string(SAMPLES_VIEW).render(kind=kind.name, listing=listing, count=count, marks={})
    assert 'data-key="q1"' in html and 'data-key="q0"' in html
    if kind.name == "mean":
        assert "0.4000" in html and "0.9000" in html  # each item's score, in the one number format
    if kind.name == "corpus":
        assert BLEU in html and "the dog sat" in html  # the record the corpus aggregation reads


@pytest.mark.parametrize("kind", list(kinds.registry().values()), ids=lambda k: k.name)
def test_every_kind_renders_its_run_diff_section(kind: MetricKind) -> None:
    TEMPLATES.env.from_string(DIFF_VIEW).render(kind=kind.name, suite={kind.name: kind.empty})  # none to show
    a = {k: _sample(kind.name, k, 0) for k in ("q0", "q1")}
    b = {"q0": _sample(kind.name, "q0", 0), "q1": _sample(kind.name, "q1", 1)}
    section = kind.diff(a, b, [METRIC[kind.name]], 50)
    assert section is not None
    html = TEMPLATES.env.from_string(DIFF_VIEW).render(kind=kind.name, suite={kind.name: section})
    # the item that changed; a corpus diff shows the metric's values over the corpus, not items
    assert (BLEU if kind.name == "corpus" else "q1") in html
