"""The GSM8k suite: config and data sources offline, then real runs against the fixture engine."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from evals.fixtures.gsm8k_data import FEWSHOT_FILE, TEST_FILE, read_jsonl
from evals.records import Sample
from evals.suites import gsm8k
from evals.suites.base import SuiteAborted, SuiteContext
from service.engine import Engine

FILTERS = {"strict-match", "flexible-extract"}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def local_config(**fields: Any) -> gsm8k.Gsm8kConfig:
    return gsm8k.Gsm8kConfig(test_file=TEST_FILE, fewshot_file=FEWSHOT_FILE, **fields)


def test_config_rejects_an_incomplete_or_mixed_local_mirror(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="needs `fewshot_file`"):
        gsm8k.Gsm8kConfig(test_file=TEST_FILE)
    with pytest.raises(ValidationError, match="needs `test_file`"):
        gsm8k.Gsm8kConfig(fewshot_file=FEWSHOT_FILE)
    assert gsm8k.Gsm8kConfig(test_file=TEST_FILE, num_fewshot=0).fewshot_file is None
    # Profiles are validated before `fixture:` references become paths: formats are checked later.
    mixed = gsm8k.Gsm8kConfig(test_file="fixture:gsm8k-test", fewshot_file=tmp_path / "train.parquet")
    with pytest.raises(ValueError, match=r"must all be \.jsonl or all \.parquet"):
        gsm8k.task_spec(mixed)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gsm8k.task_spec(gsm8k.Gsm8kConfig(test_file=tmp_path / "a.jsonl", fewshot_file=FEWSHOT_FILE))


def test_hub_source_is_the_stock_task_on_openai_gsm8k() -> None:
    spec = gsm8k.task_spec(gsm8k.Gsm8kConfig())
    assert Path(spec["include"]).is_file() and spec["include"].endswith("gsm8k/gsm8k.yaml")
    assert (spec["dataset_path"], spec["dataset_name"], spec["test_split"]) == ("openai/gsm8k", "main", "test")


def test_parquet_mirror_loads_with_its_fewshot_split(tmp_path: Path) -> None:
    for source, name in ((TEST_FILE, "test.parquet"), (FEWSHOT_FILE, "train.parquet")):
        pq.write_table(pa.Table.from_pylist(read_jsonl(source)), tmp_path / name)
    config = gsm8k.Gsm8kConfig(test_file=tmp_path / "test.parquet", fewshot_file=tmp_path / "train.parquet")
    _, task = gsm8k.load_task(config, tmp_path / "work")
    assert len(task.test_docs()) == 200 and len(task.fewshot_docs()) == 100
    assert task.test_docs()[0] == read_jsonl(TEST_FILE)[0]


def test_score_uses_the_stock_filters(tmp_path: Path) -> None:
    _, task = gsm8k.load_task(local_config(), tmp_path)
    task.set_fewshot_seed(1234)
    task.build_all_requests(limit=1)
    instance = task.instances[0]
    answer = read_jsonl(TEST_FILE)[0]["answer"]
    number = answer.rsplit("#### ", 1)[1]
    right = gsm8k.score(task, instance, f" {answer}\n\n")
    assert right.key == "gsm8k-0000" and right.prompt == instance.args[0]
    assert right.prompt.count("Question:") == 6 and right.prompt.endswith("Answer:")
    assert right.extracted == {"strict-match": number, "flexible-extract": number}
    assert right.correct == {"strict-match": True, "flexible-extract": True}
    wrong = gsm8k.score(task, instance, f" It is {number}.\n#### 999\n\n")
    assert wrong.correct == {"strict-match": False, "flexible-extract": False}
    loose = gsm8k.score(task, instance, f" The answer is {number}\n\n")
    assert loose.correct == {"strict-match": False, "flexible-extract": True}
    assert gsm8k.score(task, instance, "").extracted["strict-match"] == "[invalid]"


class Recorder:
    """The run machinery's side of a SuiteContext: what was emitted and reported."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.emitted: list[Sample] = []
        self.progress: list[tuple[int, int]] = []
        self.stop_event = threading.Event()
        self.stop_after = stop_after

    def on_progress(self, done: int, total: int) -> None:
        self.progress.append((done, total))
        if self.stop_after is not None and done >= self.stop_after:
            self.stop_event.set()

    def context(self, engine: Engine, config: gsm8k.Gsm8kConfig, work: Path, **fields: Any) -> SuiteContext:
        return SuiteContext(
            server_url=engine.url,
            served_model_name=engine.profile.served_model_name,
            model_path=engine.profile.model,
            config=config,
            work_dir=work,
            progress=self.on_progress,
            emit_samples=self.emitted.extend,
            stop_event=self.stop_event,
            **fields,
        )


@pytest.mark.engine
def test_suite_scores_the_held_out_set(gsm8k_engine: Engine, tmp_path: Path) -> None:
    recorder = Recorder()
    outcome = gsm8k.run(recorder.context(gsm8k_engine, local_config(limit=100), tmp_path))

    metrics = {m.name: m for m in outcome.metrics}
    assert set(metrics) == FILTERS
    assert 0.5 <= metrics["strict-match"].value <= 1.0, metrics
    assert all(m.n == 100 and m.stderr is not None for m in metrics.values())
    assert outcome.empty_response_rate == 0.0 and "empty_response_alarm" not in outcome.details

    samples = list(outcome.samples)
    assert len({s.key for s in samples}) == 100
    assert sorted(recorder.emitted, key=lambda s: s.key) == samples
    assert sum(s.correct["strict-match"] for s in samples) / 100 == pytest.approx(metrics["strict-match"].value)
    docs = read_jsonl(TEST_FILE)
    for sample in samples:
        doc = docs[int(sample.key.removeprefix("gsm8k-"))]
        assert sample.prompt.endswith(f"Question: {doc['question']}\nAnswer:")
        assert sample.prompt_hash == hashlib.sha256(sample.prompt.encode()).hexdigest()
        assert sample.target == doc["answer"] and sample.response.strip()
        assert set(sample.extracted) == set(sample.correct) == FILTERS

    assert recorder.progress[-1] == (100, 100)
    assert [done for done, _ in recorder.progress] == sorted(done for done, _ in recorder.progress)
    logged = Path(outcome.details["lm_eval_samples"]).read_text().splitlines()
    assert len(logged) == 2 * 100 and {json.loads(line)["filter"] for line in logged} == FILTERS


@pytest.mark.engine
def test_stop_keeps_answers_and_a_resumed_run_reuses_them(gsm8k_engine: Engine, tmp_path: Path) -> None:
    config = local_config(limit=40, concurrency=4)
    first = Recorder(stop_after=10)
    with pytest.raises(SuiteAborted, match="stopped after"):
        gsm8k.run(first.context(gsm8k_engine, config, tmp_path / "first"))
    kept = {s.key: s for s in first.emitted}
    assert 10 <= len(kept) < 40, "the stop flag must end the run before every request was sent"
    assert all(set(s.correct) == FILTERS for s in kept.values())

    second = Recorder()
    outcome = gsm8k.run(second.context(gsm8k_engine, config, tmp_path / "second", done_samples=kept))
    assert outcome.details["reused_samples"] == len(kept)
    assert not {s.key for s in second.emitted} & kept.keys(), "reused samples are not emitted again"
    assert {s.key for s in second.emitted} | kept.keys() == {s.key for s in outcome.samples}
    assert len(outcome.samples) == 40 and second.progress[0] == (len(kept), 40)
    for sample in outcome.samples:
        if sample.key in kept:
            assert sample == kept[sample.key]


@pytest.mark.engine
def test_one_request_at_a_time_still_reports_every_answer(gsm8k_engine: Engine, tmp_path: Path) -> None:
    recorder = Recorder()
    outcome = gsm8k.run(recorder.context(gsm8k_engine, local_config(limit=5, concurrency=1), tmp_path))
    assert recorder.progress == [(done, 5) for done in range(6)]
    assert sorted(recorder.emitted, key=lambda s: s.key) == list(outcome.samples) and len(outcome.samples) == 5
