"""The generic lm-eval suite: the project's own tasks offline, then real runs on the fixture engine.

Two tasks other than GSM8k, on data built from the committed synthetic problems: a 4-way
multiple choice (log-likelihood requests, which need vLLM to return prompt logprobs through
`echo`) and a generation task scored on the final number.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from evals.fixtures.gsm8k_data import TEST_FILE, read_jsonl
from evals.suites import lmeval
from evals.suites.base import SuiteAborted
from evals.verdict import Baseline
from service.engine import Engine
from service.profiles import Profile, load_profile
from service.settings import PACKAGED_PROFILES
from tests.evals.test_gsm8k_suite import Recorder

MC, FINAL = "kvcanary_arith_mc", "kvcanary_arith_final"
METRICS = {f"{MC}:acc,none", f"{MC}:acc_norm,none", f"{FINAL}:exact_match,final-number"}


def config(**fields: object) -> lmeval.LmEvalConfig:
    return lmeval.LmEvalConfig.model_validate(
        {
            "tasks": [
                {"name": MC, "metrics": ["acc,none", "acc_norm,none"]},
                {"name": FINAL, "metrics": ["exact_match,final-number"]},
            ],
            "num_fewshot": 2,
            **fields,
        }
    )


def test_project_tasks_load_offline_without_indexing_lm_evals_own() -> None:
    manager = lmeval.task_manager(config())
    assert {MC, FINAL} <= set(manager.all_tasks) and "gsm8k" not in manager.all_tasks
    tasks = manager.load([MC, FINAL])["tasks"]
    docs, problems = tasks[MC].test_docs(), read_jsonl(TEST_FILE)
    assert len(docs) == len(problems) == 200
    labels = set()
    for doc, problem in zip(docs, problems, strict=True):
        right = [c for c in doc["choices"] if c == problem["answer"]]
        assert len(right) == 1 and doc["choices"][doc["label"]] == problem["answer"]
        assert len(set(doc["choices"])) == 4
        labels.add(doc["label"])
    assert labels == {0, 1, 2, 3}
    assert tasks[FINAL].test_docs()[0]["result"] == problems[0]["answer"].rsplit("#### ", 1)[1]
    assert config().metric_names() == (f"{MC}:acc,none", f"{MC}:acc_norm,none", f"{FINAL}:exact_match,final-number")


@pytest.mark.engine
def test_two_tasks_through_the_served_model(gsm8k_engine: Engine, tmp_path: Path) -> None:
    recorder = Recorder()
    outcome = lmeval.run(recorder.context(gsm8k_engine, config(limit=30), tmp_path))

    metrics = {m.name: m for m in outcome.metrics}
    assert set(metrics) == METRICS and all(m.direction == "higher" for m in metrics.values())
    samples = list(outcome.samples)
    assert sorted(recorder.emitted, key=lambda s: s.key) == samples
    by_task = {task: [s for s in samples if s.key.startswith(task)] for task in (MC, FINAL)}
    assert len(by_task[MC]) == len(by_task[FINAL]) == 30
    for name, metric in metrics.items():
        flags = [s.correct[name] for s in samples if name in s.correct]
        assert metric.n == len(flags) == 30 and metric.value == pytest.approx(sum(flags) / 30), name
        assert metric.stderr is not None
    # The tiny model was trained on these worked answers: it ranks the right one first far
    # above the 1-in-4 chance, which it could not if the prompt logprobs were misaligned.
    assert metrics[f"{MC}:acc,none"].value >= 0.6, metrics
    for sample in by_task[MC]:
        assert sample.prompt == "" and len(json.loads(sample.response)) == 4  # four log-likelihoods
    problems = read_jsonl(TEST_FILE)
    for sample in by_task[FINAL]:
        doc = problems[int(sample.key.rsplit("-", 1)[1])]
        assert sample.prompt.endswith(f"Question: {doc['question']}\nAnswer:")
        assert sample.prompt_hash == hashlib.sha256(sample.prompt.encode()).hexdigest()
        number = re.search(r"#### (-?\d+)", sample.response)
        assert sample.correct[f"{FINAL}:exact_match,final-number"] == (
            number is not None and number.group(1) == sample.target
        )
    assert outcome.empty_response_rate == 0.0
    assert recorder.progress[-1][0] == recorder.progress[-1][1] == 30 * 4 + 30


@pytest.mark.engine
def test_stop_flag_ends_the_suite(gsm8k_engine: Engine, tmp_path: Path) -> None:
    recorder = Recorder(stop_after=5)
    with pytest.raises(SuiteAborted, match="stopped after"):
        lmeval.run(recorder.context(gsm8k_engine, config(limit=40, concurrency=2), tmp_path))
    assert recorder.progress[-1][0] < recorder.progress[-1][1]


@pytest.mark.engine
def test_a_metric_that_is_not_zero_one_is_judged_by_its_mean(gsm8k_engine: Engine, tmp_path: Path) -> None:
    """lm-eval's F1 per item (the project's `kvcanary_arith_f1`) is kept per item and judged as a
    mean; judged as 0/1 accuracy it had no sample scored and failed."""
    from evals import suites
    from evals.kinds import mean

    recorder = Recorder()
    tasks = {"tasks": [{"name": "kvcanary_arith_f1", "metrics": ["f1,none"]}], "num_fewshot": 2, "limit": 20}
    outcome = lmeval.run(recorder.context(gsm8k_engine, lmeval.LmEvalConfig.model_validate(tasks), tmp_path))
    (metric,) = outcome.metrics
    kind = suites.metric_kind(lmeval.NAME, metric.name)
    scores = kind.scores({s.key: s for s in outcome.samples}, metric.name)
    assert kind is mean.KIND and metric.n == len(scores) == 20
    assert all(0 <= v <= 1 for v in scores.values()) and len(set(scores.values())) > 2  # not 0/1
    assert metric.value == pytest.approx(sum(scores.values()) / 20)  # lm-eval's own mean aggregation
    assert not any(s.correct for s in outcome.samples)
    judged = kind.judge(lmeval.NAME, metric.name, scores, None, scores)
    assert judged.verdict == "pass" and judged.value == pytest.approx(metric.value) and judged.n == 20


@pytest.mark.engine
def test_a_corpus_metric_is_judged_by_resampling_items(gsm8k_engine: Engine, tmp_path: Path) -> None:
    """lm-eval's corpus BLEU (the project's `kvcanary_arith_bleu`) keeps each item's record; the corpus
    kind recomputes lm-eval's own value from them and judges it by resampling items."""
    from evals import suites
    from evals.kinds import corpus

    recorder = Recorder()
    tasks = {"tasks": [{"name": "kvcanary_arith_bleu", "metrics": ["bleu,none"]}], "num_fewshot": 2, "limit": 20}
    outcome = lmeval.run(recorder.context(gsm8k_engine, lmeval.LmEvalConfig.model_validate(tasks), tmp_path))
    (metric,) = outcome.metrics
    kind = suites.metric_kind(lmeval.NAME, metric.name)
    records = kind.scores({s.key: s for s in outcome.samples}, metric.name)
    assert kind is corpus.KIND and metric.n == len(records) == 20
    judged = kind.judge(lmeval.NAME, metric.name, records, None, records)
    assert judged.value == pytest.approx(metric.value) and 0 < judged.value <= 100  # lm-eval's own corpus BLEU
    assert judged.verdict == "pass" and judged.details["matched"] == 20


EXAMPLE = "lm-eval-arith-tiny-cpu"


def example_profile() -> Profile:
    return load_profile(PACKAGED_PROFILES / f"{EXAMPLE}.yaml")


def test_the_example_profile_runs_a_shipped_task_without_a_hub() -> None:
    """The shipped example of an lm-eval task by profile names only tasks whose data the project
    ships: lm-eval's own task index (whose tasks fetch data from a hub) is never needed."""
    profile = example_profile()
    (entry,) = profile.suites
    suite_config = entry.config()
    assert entry.suite == lmeval.NAME and isinstance(suite_config, lmeval.LmEvalConfig)
    manager = lmeval.task_manager(suite_config)
    assert "arc_easy" not in manager.all_tasks  # the local index only
    (task,) = suite_config.tasks
    assert len(manager.load([task.name])["tasks"][task.name].test_docs()) >= (suite_config.limit or 0)
    assert set(profile.baselines[lmeval.NAME]) <= set(suite_config.metric_names())


@pytest.mark.engine
def test_the_example_profile_passes_its_baselines_on_the_fixture(gsm8k_engine: Engine, tmp_path: Path) -> None:
    from evals import suites

    profile = example_profile()
    (entry,) = profile.suites
    outcome = lmeval.run(Recorder().context(gsm8k_engine, entry.config(), tmp_path))
    samples = {s.key: s for s in outcome.samples}
    for name, spec in profile.baselines[lmeval.NAME].items():
        kind = suites.metric_kind(lmeval.NAME, name)
        baseline = Baseline.stored(spec.value, spec.direction, spec.tolerance.kind, spec.tolerance.value)
        judged = kind.judge(lmeval.NAME, name, kind.scores(samples, name), baseline)
        print(f"{name}: {judged.value} ({judged.n} items) {judged.verdict}")
        assert judged.verdict == "pass" and judged.n == profile.suites[0].config().limit, judged.explanation
