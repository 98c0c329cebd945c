"""The corpus kind: lm-eval's corpus-level metrics (BLEU) judged by resampling items, not failed."""

from __future__ import annotations

import random

import pytest

from evals import suites
from evals.kinds import corpus
from evals.records import Sample
from evals.verdict import Baseline

BLEU = "kvcanary_arith_bleu:bleu,none"
WORDS = ["the", "cat", "sat", "on", "the", "mat", "and", "then", "it", "ran", "far", "away", "from", "the", "dog"]


def _records(n: int, damaged: float, seed: int = 0) -> dict[str, list[str]]:
    """n (reference, prediction) records, a `damaged` share of each prediction's words replaced."""
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        reference = " ".join(rng.sample(WORDS, 10))
        prediction = " ".join(w if rng.random() >= damaged else "zzz" for w in reference.split())
        out[f"q{i:03d}"] = [reference, prediction]
    return out


def test_lm_eval_corpus_metrics_get_the_corpus_kind() -> None:
    assert suites.metric_kind("lm-eval", BLEU) is corpus.KIND
    assert suites.metric_kind("lm-eval", "wikitext:word_perplexity,none") is corpus.KIND


def test_the_value_is_lm_evals_corpus_aggregation_not_a_mean_of_items() -> None:
    records = _records(60, 0.2)
    judged = corpus.judge_corpus("lm-eval", BLEU, records, Baseline(50.0, "higher", "absolute", 10.0))
    assert judged.value == pytest.approx(corpus.aggregation(BLEU)(list(records.values())))
    assert judged.details["ci_low"] < judged.value < judged.details["ci_high"]  # type: ignore[operator]
    assert judged.verdict == "pass" and "resamples of items" in judged.explanation
    worse = corpus.judge_corpus("lm-eval", BLEU, _records(60, 0.6), Baseline(50.0, "higher", "absolute", 10.0))
    assert worse.verdict == "fail" and worse.value < 40


def test_a_paired_drop_on_the_same_items_fails() -> None:
    reference = _records(80, 0.1, seed=1)
    damaged = _records(80, 0.4, seed=1)  # the same references, more words lost
    judged = corpus.judge_corpus("lm-eval", BLEU, damaged, None, reference)
    assert judged.verdict == "fail" and "significant regression" in judged.explanation
    same = corpus.judge_corpus("lm-eval", BLEU, reference, None, reference)
    assert same.verdict == "pass" and same.details["change"] == 0.0


def test_the_diff_gives_both_corpus_values_on_the_matched_items() -> None:
    def rows(records: dict[str, list[str]]) -> dict[str, Sample]:
        return {k: Sample(key=k, prompt_hash="h", target=r, response=p, data={"corpus": {BLEU: [r, p]}})
                for k, (r, p) in records.items()}  # fmt: skip

    a, b = rows(_records(30, 0.1, seed=2)), rows(_records(20, 0.5, seed=2))
    [section] = corpus.KIND.diff(a, b, [BLEU], 50) or []
    assert (section.metric, section.matched) == (BLEU, 20) and section.value_a > section.value_b
    assert corpus.KIND.metrics_in(a) == [BLEU] and corpus.KIND.passed(a["q000"], BLEU) is None
