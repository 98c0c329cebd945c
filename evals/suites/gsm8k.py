"""GSM8k through lm-eval's stock task and its `local-completions` model, against a live server.

lm-eval builds the prompts (n-shot), sends them, filters the answers (strict-match and
flexible-extract) and computes the metrics with their stderr; this module adds what a run
needs around it. The observed `local-completions` model (`lm_eval_client`) hands every answer
to a collector as it arrives, which reports progress, scores the answer with the task's own
filters and emits the sample (so a run that dies keeps what it got); the model checks the
run's stop flag before each request and answers prompts that an earlier attempt already
stored (`context.done_samples`) without asking the server.

The data is the hub's `openai/gsm8k` (production) or a local mirror (JSONL or parquet with
`question` and `answer`), through a task YAML in the work folder that includes the stock one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, model_validator

from evals.kinds.accuracy import KIND as ACCURACY
from evals.records import MetricValue, Sample
from evals.suites.base import MetricSpec, SuiteConfig, SuiteContext, SuiteDefinition, SuiteOutcome
from evals.suites.lm_eval_client import (
    EMIT_EVERY,
    EMIT_INTERVAL_S,
    evaluate,
    known_answers,
    observed_model_class,
)

TASK = "gsm8k"
FILTERS = ("strict-match", "flexible-extract")
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class Gsm8kConfig(SuiteConfig):
    """A hub dataset (`hub_path`, `hub_name`, `split`) unless `test_file` names a local mirror.

    A local mirror's few-shot examples come from `fewshot_file` (the stock task draws them
    from GSM8k's train split); both files use the same format, JSONL or parquet.
    """

    num_fewshot: int = Field(5, ge=0)
    fewshot_seed: int = 1234
    hub_path: str = "openai/gsm8k"
    hub_name: str = "main"
    split: str = "test"
    test_file: Path | None = None
    fewshot_file: Path | None = None

    @model_validator(mode="after")
    def _local_mirror_is_complete(self) -> Gsm8kConfig:
        if self.test_file is None and self.fewshot_file is not None:
            raise ValueError("gsm8k: `fewshot_file` needs `test_file` (the local mirror's test split)")
        if self.test_file is not None and self.fewshot_file is None and self.num_fewshot > 0:
            raise ValueError(f"gsm8k: num_fewshot={self.num_fewshot} with a local `test_file` needs `fewshot_file`")
        return self


def task_spec(config: Gsm8kConfig) -> dict[str, Any]:
    """The task YAML's content: the stock gsm8k task, with the data source swapped if local."""
    import lm_eval.tasks

    stock = Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k.yaml"
    spec: dict[str, Any] = {"task": TASK, "include": str(stock)}
    if config.test_file is None:
        return spec | {"dataset_path": config.hub_path, "dataset_name": config.hub_name, "test_split": config.split}
    paths = [p for p in (config.test_file, config.fewshot_file) if p is not None]
    formats = {LOCAL_FORMATS.get(p.suffix) for p in paths}
    if None in formats or len(formats) > 1:
        raise ValueError(f"gsm8k: local files must all be .jsonl or all .parquet; got {[str(p) for p in paths]}")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"gsm8k: local dataset file {path} does not exist")
    files = {"test": str(config.test_file.resolve())}
    if config.fewshot_file is not None:
        files["train"] = str(config.fewshot_file.resolve())
    return spec | {
        "dataset_path": LOCAL_FORMATS[config.test_file.suffix],
        "dataset_name": None,
        "dataset_kwargs": {"data_files": files},
        "test_split": "test",
        "training_split": "train" if config.fewshot_file else None,
        "fewshot_split": "train" if config.fewshot_file else None,
    }


def load_task(config: Gsm8kConfig, work_dir: Path) -> tuple[Any, Any]:
    """(TaskManager, Task) from a YAML written into `work_dir/tasks`.

    Only that folder is indexed: lm-eval's default manager parses every task YAML it ships
    (thousands), which costs more than the whole evaluation of a small model.
    """
    from lm_eval.tasks import TaskManager

    folder = work_dir / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{TASK}.yaml").write_text(yaml.safe_dump(task_spec(config), sort_keys=False))
    manager = TaskManager(include_path=str(folder), include_defaults=False)
    return manager, manager.load([TASK])["tasks"][TASK]


def score(task: Any, instance: Any, response: str) -> Sample:
    """One answer through the task's own filters and metric, as lm-eval's evaluator does it."""
    probe = dataclasses.replace(instance, resps=[response], filtered_resps={})
    for ensemble in task._filters:  # the FilterEnsembles built from the task's filter_list
        ensemble.apply([probe])
    extracted: dict[str, str] = {}
    correct: dict[str, bool] = {}
    for name, value in probe.filtered_resps.items():
        extracted[name] = str(value)
        correct[name] = bool(task.process_results(instance.doc, [value])["exact_match"])
    prompt = instance.args[0]
    return Sample(
        key=f"{TASK}-{instance.doc_id:04d}",
        prompt_hash=hashlib.sha256(prompt.encode()).hexdigest(),
        prompt=prompt,
        target=str(task.doc_to_target(instance.doc)),
        response=response,
        extracted=extracted,
        correct=correct,
    )


class _Collector:
    """Scores answers as they arrive, reports progress, and hands samples out in small batches."""

    def __init__(self, context: SuiteContext, task: Any, known: Mapping[str, str]) -> None:
        self.context = context
        self.task = task
        self.known = known
        self.by_prompt: dict[str, list[Any]] = {}
        self.samples: dict[str, Sample] = {}
        self.pending: list[Sample] = []
        self.last_emit = time.monotonic()
        self.total = 0

    def expect(self, instances: Sequence[Any]) -> Mapping[str, str]:
        """Note what will be asked; score (without emitting) what an earlier attempt stored."""
        self.total = len(instances)
        for instance in instances:
            self.by_prompt.setdefault(instance.args[0], []).append(instance)
            if instance.args[0] in self.known:
                sample = score(self.task, instance, self.known[instance.args[0]])
                self.samples[sample.key] = sample
        self.context.progress(len(self.samples), self.total)
        return self.known

    def on_answer(self, kind: str, prompt: str, response: Any) -> None:
        if kind != "generate_until":
            return
        for instance in self.by_prompt.get(prompt, []):
            sample = score(self.task, instance, response)
            self.samples[sample.key] = sample
            self.pending.append(sample)
        self.context.progress(len(self.samples), self.total)
        if len(self.pending) >= EMIT_EVERY or time.monotonic() - self.last_emit >= EMIT_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.context.emit_samples(self.pending)
            self.pending = []
        self.last_emit = time.monotonic()


def _metrics(results: Mapping[str, Any], n: int) -> list[MetricValue]:
    found = results["results"][TASK]
    metrics = []
    for name in FILTERS:
        stderr = found.get(f"exact_match_stderr,{name}")
        metrics.append(
            MetricValue(
                name=name,
                value=float(found[f"exact_match,{name}"]),
                n=n,
                stderr=float(stderr) if isinstance(stderr, int | float) else None,
            )
        )
    return metrics


def run(context: SuiteContext) -> SuiteOutcome:

    config: Gsm8kConfig = context.config
    manager, task = load_task(config, context.work_dir)
    known = known_answers(context)
    collector = _Collector(context, task, known)
    model = observed_model_class()(
        collector,
        base_url=f"{context.server_url.rstrip('/')}/v1/completions",
        model=context.served_model_name,
        num_concurrent=config.concurrency,
        max_retries=config.max_retries,
        timeout=int(config.request_timeout_s),
        tokenized_requests=False,
        tokenizer_backend=None,
    )
    try:
        results = evaluate(
            context,
            TASK,
            lambda: f"{len(collector.samples)} of {collector.total} answers",
            model=model,
            tasks=[task],
            task_manager=manager,
            num_fewshot=config.num_fewshot,
            limit=config.limit,
            log_samples=True,
            fewshot_random_seed=config.fewshot_seed,
        )
    finally:
        collector.flush()
    samples = sorted(collector.samples.values(), key=lambda s: s.key)
    empty = sum(1 for s in samples if not s.response.strip())
    rate = empty / len(samples) if samples else 1.0
    log_path = context.work_dir / "lm_eval_samples.jsonl"
    log_path.write_text("".join(json.dumps(row, default=str) + "\n" for row in results["samples"][TASK]))
    details: dict[str, Any] = {
        "dataset": str(config.test_file) if config.test_file else f"{config.hub_path}:{config.hub_name}:{config.split}",
        "num_fewshot": config.num_fewshot,
        "questions": len(samples),
        "empty_responses": empty,
        "reused_samples": sum(1 for s in samples if s.prompt in known),
        "lm_eval_version": version("lm_eval"),
        "lm_eval_samples": str(log_path),
    }
    if rate > config.max_empty_response_rate:
        details["empty_response_alarm"] = (
            f"{empty} of {len(samples)} answers are empty ({rate:.1%} > max_empty_response_rate "
            f"{config.max_empty_response_rate:.1%}): the engine answers without text"
        )
    return SuiteOutcome(
        metrics=_metrics(results, len(samples)), samples=samples, empty_response_rate=rate, details=details
    )


DEFINITION = SuiteDefinition(
    name=TASK, config_model=Gsm8kConfig, metrics=tuple(MetricSpec(f, ACCURACY) for f in FILTERS), run=run
)
