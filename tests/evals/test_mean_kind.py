"""The mean kind: lm-eval metrics that are not 0/1 (F1 per item) are judged, not failed."""

from __future__ import annotations

import random

import pytest

from evals import suites
from evals.kinds import mean
from evals.kinds.accuracy import KIND as ACCURACY
from evals.records import Sample
from evals.verdict import Baseline

F1 = "kvcanary_arith_f1:f1,none"
RULE = Baseline(0.70, "higher", "absolute", 0.05, "a reference run")


def _scores(n: int, centre: float, seed: int = 0) -> dict[str, float]:
    rng = random.Random(seed)
    return {f"q{i:03d}": min(1.0, max(0.0, rng.gauss(centre, 0.1))) for i in range(n)}


def _sample(key: str, score: float | None, response: str = "r") -> Sample:
    data = {} if score is None else {"mean": {F1: score}}
    return Sample(key=key, prompt_hash="h", target="t", response=response, data=data)


def test_lm_eval_names_a_kind_per_metric() -> None:
    assert suites.metric_kind("lm-eval", "gsm8k:exact_match,strict-match") is ACCURACY
    assert suites.metric_kind("lm-eval", "mmlu:acc,none") is ACCURACY
    assert suites.metric_kind("lm-eval", F1) is mean.KIND
    assert suites.metric_kind("lm-eval", "drop:f1,none") is mean.KIND


def test_the_mean_passes_near_its_baseline_and_fails_below_it() -> None:
    good = mean.judge_mean("lm-eval", F1, _scores(400, 0.72), RULE)
    assert good.verdict == "pass" and good.value == pytest.approx(sum(_scores(400, 0.72).values()) / 400)
    assert good.details["ci_low"] < good.value < good.details["ci_high"]  # type: ignore[operator]
    assert "mean over 400 items" in good.explanation
    bad = mean.judge_mean("lm-eval", F1, _scores(400, 0.55), RULE)
    assert bad.verdict == "fail" and "is below the threshold 0.6500" in bad.explanation
    few = mean.judge_mean("lm-eval", F1, _scores(5, 0.72), RULE)
    assert few.verdict == "inconclusive"  # five items cannot see a 0.05 drop


def test_a_paired_drop_fails_where_the_tolerance_alone_would_pass() -> None:
    reference = _scores(300, 0.80, seed=1)
    candidate = {k: v - 0.03 for k, v in reference.items()}  # every item a little worse
    judged = mean.judge_mean("lm-eval", F1, candidate, Baseline(None, "higher", "absolute", 0.1), reference)
    assert judged.verdict == "fail" and judged.details["items_worse"] == 300
    assert "significant regression" in judged.explanation
    same = mean.judge_mean("lm-eval", F1, dict(reference), None, reference)
    assert same.verdict == "pass" and same.details["p_value"] == 1.0


def test_lower_is_better_comes_from_the_baseline() -> None:
    rule = Baseline(10.0, "lower", "relative", 0.1)
    assert mean.judge_mean("lm-eval", "t:perplexity,none", {"a": 9.0, "b": 10.0}, rule).threshold == 11.0
    reference = _scores(200, 0.5, seed=2)
    higher = {k: v + 0.05 for k, v in reference.items()}
    assert mean.judge_mean("lm-eval", "t:loss,none", higher, rule, reference).verdict == "fail"


def test_scores_diff_and_severity_read_data_only() -> None:
    a = {"q1": _sample("q1", 0.9, "a1"), "q2": _sample("q2", 0.5), "q3": _sample("q3", None)}
    b = {"q1": _sample("q1", 0.4, "b1"), "q2": _sample("q2", 0.6), "q3": _sample("q3", 0.7)}
    assert mean.KIND.scores(a, F1) == {"q1": 0.9, "q2": 0.5}
    diff = mean.KIND.diff(a, b, [F1], 50)
    assert diff is not None and len(diff) == 1
    section = diff[0]
    assert (section.matched, section.lower, section.higher) == (2, 1, 1)
    assert [c.key for c in section.changes] == ["q1", "q2"]  # the largest change first
    assert (section.changes[0].response_a, section.changes[0].score_b) == ("a1", 0.4)
    assert [c.summary for c in mean.KIND.changes(diff)] == ["1 items lower, 1 higher of 2"]
    assert mean.KIND.severity(a["q1"], F1) == -0.9 and mean.KIND.severity(a["q3"], F1) is None
    assert mean.KIND.metrics_in(a) == [F1]
