"""Any lm-eval task, as vLLM's accuracy configs name them, through the same client as GSM8k.

A profile lists tasks (`gsm8k`, `mmlu_pro`, a group, or a task YAML in `task_dirs`) and for
each the metrics to judge, in lm-eval's own `metric,filter` spelling. Each is reported as
`<task>:<metric>,<filter>` (e.g. `gsm8k:exact_match,strict-match`) with the task's own
higher/lower-is-better. Per-item rows come from lm-eval's logged samples: a metric whose
per-item value is 0 or 1 (accuracy, exact match, pass@1: `ZERO_ONE`) becomes a `correct` flag, so
it is judged like GSM8k (McNemar against a reference, Wilson interval, MDE); any other metric
(F1) keeps its per-item number for the mean kind (`evals.kinds.mean`: mean with a bootstrap
interval, paired bootstrap against a reference), and a corpus-level one (BLEU, perplexity) keeps
each item's record for the corpus kind (`evals.kinds.corpus`: lm-eval's own aggregation,
resampling items). Log-likelihood items (multiple choice) are scored from several requests and
are stored once lm-eval finishes.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evals.kinds import MetricKind
from evals.kinds import corpus as corpus_kind
from evals.kinds import mean as mean_kind
from evals.kinds.accuracy import KIND as ACCURACY
from evals.records import MetricValue, Sample
from evals.suites.base import SuiteConfig, SuiteContext, SuiteDefinition, SuiteOutcome
from evals.suites.lm_eval_client import evaluate, known_answers, observed_model_class

NAME = "lm-eval"
ZERO_ONE = frozenset({"acc", "acc_norm", "exact_match", "em", "pass@1", "correct"})  # lm-eval's 0/1 metrics
TASKS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "lm_eval_tasks"


class TaskMetrics(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    metrics: list[str] = Field(min_length=1, description="lm-eval result keys, `metric,filter`")


class LmEvalConfig(SuiteConfig):
    """The lm-eval arguments of vLLM's harness; `task_dirs` adds folders of task YAMLs."""

    tasks: list[TaskMetrics] = Field(min_length=1)
    num_fewshot: int | None = Field(None, ge=0)
    fewshot_seed: int = 1234
    gen_kwargs: str | None = None
    apply_chat_template: bool = False
    fewshot_as_multiturn: bool = False
    metadata: dict[str, Any] | None = None
    task_dirs: list[Path] = Field(default_factory=lambda: [TASKS_DIR])

    def metric_names(self) -> tuple[str, ...]:
        return tuple(f"{task.name}:{metric}" for task in self.tasks for metric in task.metrics)


def task_manager(config: LmEvalConfig) -> Any:
    """A TaskManager that indexes lm-eval's own tasks only when `task_dirs` lacks one asked for.

    Indexing every task lm-eval ships parses thousands of YAML files; local tasks need none.
    """
    from lm_eval.tasks import TaskManager

    paths = [str(p) for p in config.task_dirs if Path(p).is_dir()]
    wanted = {task.name for task in config.tasks}
    if paths:
        local = TaskManager(include_path=paths, include_defaults=False)
        if wanted <= set(local.all_tasks):
            return local
    return TaskManager(include_path=paths or None, include_defaults=True)


class _Progress:
    """Counts answers for progress; the observed model asks it for reusable answers."""

    def __init__(self, context: SuiteContext, known: Mapping[str, str]) -> None:
        self.context = context
        self.known = known
        self.total = 0
        self.done = 0
        self.last = 0.0

    def expect(self, instances: Sequence[Any]) -> Mapping[str, str]:
        self.total += len(instances)
        self.done += sum(1 for i in instances if i.args[0] in self.known)
        self.context.progress(self.done, self.total)
        return self.known

    def on_answer(self, kind: str, prompt: str, response: Any) -> None:
        self.done += 1
        if time.monotonic() - self.last >= 1.0 or self.done == self.total:
            self.context.progress(self.done, self.total)
            self.last = time.monotonic()


def _leaves(results: Mapping[str, Any], name: str) -> list[str]:
    """The tasks whose samples make up `name`: itself, or a group's subtasks, recursively."""
    groups: Mapping[str, list[str]] = results.get("group_subtasks", {})
    if name not in groups or not groups[name]:
        return [name]
    return [leaf for sub in groups[name] for leaf in _leaves(results, sub)]


def _prompt(entry: Mapping[str, Any]) -> str:
    args = entry.get("arguments")
    if isinstance(args, Mapping):
        first: Any = next(iter(args.values()), {})
        return str(first.get("arg_0", "")) if isinstance(first, Mapping) else ""
    if isinstance(args, Sequence) and args and isinstance(args[0], Sequence):
        return str(args[0][0])
    return ""


def _samples(results: Mapping[str, Any], config: LmEvalConfig) -> list[Sample]:
    """One row per (task, item); a 0/1 per-item value of a judged metric becomes its flag."""
    rows: dict[str, dict[str, Any]] = {}
    for task in config.tasks:
        for leaf in _leaves(results, task.name):
            for entry in results["samples"].get(leaf, []):
                key = f"{leaf}-{int(entry['doc_id']):05d}"
                generated = entry.get("resps") and all(isinstance(r[0], str) for r in entry["resps"])
                row = rows.setdefault(
                    key,
                    {
                        "prompt": _prompt(entry) if generated else "",
                        "target": str(entry.get("target", "")),
                        "response": str(entry["resps"][0][0]) if generated else json.dumps(entry.get("resps")),
                        "extracted": {},
                        "correct": {},
                        "data": {},
                    },
                )
                flt = str(entry.get("filter", "none"))
                row["extracted"][flt] = str(entry.get("filtered_resps"))
                for metric in task.metrics:
                    base, _, wanted_filter = metric.partition(",")
                    value = entry.get(base)
                    name = f"{task.name}:{metric}"
                    kind = kind_of(name)
                    if wanted_filter != flt or value is None:
                        continue
                    if kind is corpus_kind.KIND:  # a record the corpus aggregation reads (reference, prediction)
                        row["data"].setdefault(corpus_kind.NAME, {})[name] = json.loads(json.dumps(value))
                    elif not isinstance(value, bool | int | float):
                        continue
                    elif kind is ACCURACY and value in (0, 1):
                        row["correct"][name] = bool(value)
                    elif kind is mean_kind.KIND:
                        row["data"].setdefault(mean_kind.NAME, {})[name] = float(value)
    return [
        Sample(
            key=key,
            prompt_hash=hashlib.sha256(row["prompt"].encode()).hexdigest(),
            prompt=row["prompt"],
            target=row["target"],
            response=row["response"],
            extracted=row["extracted"],
            correct=row["correct"],
            data=row["data"],
        )
        for key, row in sorted(rows.items())
    ]


def _metrics(results: Mapping[str, Any], config: LmEvalConfig, samples: Sequence[Sample]) -> list[MetricValue]:
    metrics = []
    for task in config.tasks:
        found = results["results"].get(task.name, {})
        better = results.get("higher_is_better", {}).get(task.name, {})
        for metric in task.metrics:
            if metric not in found:
                raise KeyError(f"lm-eval: task {task.name!r} reported no {metric!r}; it reported {sorted(found)}")
            base, _, flt = metric.partition(",")
            stderr = found.get(f"{base}_stderr,{flt}")
            name = f"{task.name}:{metric}"
            metrics.append(
                MetricValue(
                    name=name,
                    value=float(found[metric]),
                    n=len(kind_of(name).scores({s.key: s for s in samples}, name)) or len(samples),
                    stderr=float(stderr) if isinstance(stderr, int | float) else None,
                    direction="lower" if better.get(base) is False else "higher",
                )
            )
    return metrics


def run(context: SuiteContext) -> SuiteOutcome:

    config: LmEvalConfig = context.config
    manager = task_manager(config)
    known = known_answers(context)
    progress = _Progress(context, known)
    chat = config.apply_chat_template
    model = observed_model_class(chat=chat)(
        progress,
        base_url=f"{context.server_url.rstrip('/')}/v1/{'chat/completions' if chat else 'completions'}",
        model=context.served_model_name,
        num_concurrent=config.concurrency,
        max_retries=config.max_retries,
        timeout=int(config.request_timeout_s),
        # Log-likelihood needs the context length in tokens: the served model's own tokenizer,
        # adding its special tokens (BOS) as the server does for text and vLLM's harness does.
        tokenized_requests=not chat,
        tokenizer_backend=None if chat else "huggingface",
        tokenizer=context.model_path,
        add_bos_token=True,
    )
    results = evaluate(
        context,
        NAME,
        lambda: f"{progress.done} of {progress.total} requests",
        model=model,
        tasks=[task.name for task in config.tasks],
        task_manager=manager,
        num_fewshot=config.num_fewshot,
        limit=config.limit,
        log_samples=True,
        fewshot_random_seed=config.fewshot_seed,
        gen_kwargs=config.gen_kwargs,
        apply_chat_template=chat,
        fewshot_as_multiturn=config.fewshot_as_multiturn,
        metadata=config.metadata,
    )
    samples = _samples(results, config)
    context.emit_samples(samples)
    generated = [s for s in samples if s.prompt]
    empty = sum(1 for s in generated if not s.response.strip())
    rate = empty / len(generated) if generated else 0.0
    log_path = context.work_dir / "lm_eval_samples.jsonl"
    log_path.write_text(
        "".join(json.dumps(row, default=str) + "\n" for rows in results["samples"].values() for row in rows)
    )
    details: dict[str, Any] = {
        "tasks": [task.name for task in config.tasks],
        "num_fewshot": config.num_fewshot,
        "items": len(samples),
        "empty_responses": empty,
        "reused_samples": sum(1 for s in generated if s.prompt in known),
        "lm_eval_version": version("lm_eval"),
        "lm_eval_samples": str(log_path),
    }
    return SuiteOutcome(
        metrics=_metrics(results, config, samples), samples=samples, empty_response_rate=rate, details=details
    )


def kind_of(metric: str) -> MetricKind:
    """`task:metric,filter` -> accuracy for lm-eval's 0/1 metrics, corpus for its corpus-level ones
    (BLEU, perplexity), else the mean of the per-item numbers."""
    base = metric.partition(":")[2].partition(",")[0]
    return ACCURACY if base in ZERO_ONE else corpus_kind.KIND if base in corpus_kind.METRICS else mean_kind.KIND


DEFINITION = SuiteDefinition(name=NAME, config_model=LmEvalConfig, metrics=(), run=run, open_kind=kind_of)
