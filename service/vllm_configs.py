"""vLLM's lm-eval accuracy configs (`.buildkite/lm-eval-harness/configs/`) read as profiles.

A GPU host points `KVCANARY_VLLM_CONFIGS` at files, folders or `models-*.txt` lists of a vLLM
checkout, and every config becomes a profile without being rewritten: the model, the engine
settings vLLM's harness passes (`max_model_len` defaulting to 4096, `enforce_eager` to true,
`trust_remote_code`, `kv_cache_dtype`, ...), the tasks and metrics for the `lm-eval` suite,
and each metric's ground-truth `value` as a baseline under vLLM's own rule: one-sided,
relative, pass when measured >= value * (1 - rtol), `rtol` 0.08 unless the file sets one.
Keys that change nothing here, or that vLLM's harness does not read, are reported by file,
key and reason (`kvcanary profiles show NAME`, and the service's log at start).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from evals.suites.lmeval import NAME as LM_EVAL
from service.profiles import NAME_PATTERN, Profile, ProfileError, describe, read_mapping

DEFAULT_RTOL = 0.08
DEFAULT_MAX_MODEL_LEN = 4096  # what vLLM's harness passes when a file names none
METRIC_NAME_LIMIT = 64  # the database's metric column

# Keys vLLM's harness reads that have no effect on a served model, with the reason.
NOT_APPLIED = {
    "batch_size": "lm-eval's batch size for an in-process model; the server batches requests itself",
    "required_gpu_arch": "vLLM's harness skips the file on other ROCm GPUs; kvcanary runs it where it is sent",
    "rocm_safetensors_load_strategy": "a ROCm-only load option of vLLM's harness; not passed to the server",
}


@dataclass(frozen=True)
class Note:
    """Something in a file that kvcanary did not apply, and why."""

    file: Path
    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.reason}"


@dataclass(frozen=True)
class VllmConfig:
    """One file as understood: the profile, where each key went, and what was not applied."""

    path: Path
    profile: Profile
    understood: tuple[tuple[str, str], ...]
    notes: tuple[Note, ...]


def profile_name(path: Path) -> str:
    """`Meta-Llama-3-8B-Instruct.yaml` -> `meta-llama-3-8b-instruct` (profile names are lower case)."""
    return path.stem.lower()


def _flag(value: Any) -> bool:
    """vLLM's files write booleans as YAML booleans or as the strings "true"/"false"."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"expected true or false, got {value!r}")


def _served_name(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._/-]", "-", model)[:128]


class _Reader:
    """Turns one parsed file into profile fields, recording where every key went."""

    def __init__(self, path: Path, raw: dict[str, Any], tensor_parallel_size: int) -> None:
        self.path = path
        self.raw = raw
        self.understood: list[tuple[str, str]] = []
        self.notes: list[Note] = []
        self.engine: dict[str, Any] = {
            "tensor_parallel_size": tensor_parallel_size,
            "max_model_len": DEFAULT_MAX_MODEL_LEN,
            "enforce_eager": True,
            "extra_args": [],
            "env": {},
        }
        self.suite: dict[str, Any] = {"suite": LM_EVAL}

    def _engine_flag(self, flag: str) -> Callable[[Any], str]:
        def apply(value: Any) -> str:
            if str(value) == "auto":
                return "auto: the server's default"
            self.engine["extra_args"] += [flag, str(value)]
            return f"engine.extra_args {flag} {value}"

        return apply

    def _set_engine(self, key: str, convert: Callable[[Any], Any] = lambda v: v) -> Callable[[Any], str]:
        def apply(value: Any) -> str:
            self.engine[key] = convert(value)
            return f"engine.{key} = {self.engine[key]!r}"

        return apply

    def _set_suite(self, key: str, convert: Callable[[Any], Any] = lambda v: v) -> Callable[[Any], str]:
        def apply(value: Any) -> str:
            self.suite[key] = convert(value)
            return f"suites.{LM_EVAL}.{key} = {self.suite[key]!r}"

        return apply

    def _env(self, value: Any) -> str:
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping of variable to value, got {type(value).__name__}")
        self.engine["env"].update({str(k): str(v) for k, v in value.items()})
        return f"engine.env {sorted(value)}"

    def _backend(self, value: Any) -> str:
        if value != "vllm":
            raise ValueError(
                f"backend {value!r} is not served here: only `vllm` (text through /v1/completions) is; "
                "multimodal tasks (`vllm-vlm`) need images the lm-eval suite does not send"
            )
        return "the served model through local-completions"

    def read(self) -> dict[str, Any]:
        handlers: dict[str, Callable[[Any], str]] = {
            "model_name": lambda v: "model, served_model_name",
            "tasks": lambda v: f"suites.{LM_EVAL}.tasks and baselines",
            "rtol": lambda v: "each baseline's relative tolerance",
            "limit": self._set_suite("limit", int),
            "num_fewshot": self._set_suite("num_fewshot", int),
            "gen_kwargs": self._set_suite("gen_kwargs", str),
            "apply_chat_template": self._set_suite("apply_chat_template", _flag),
            "fewshot_as_multiturn": self._set_suite("fewshot_as_multiturn", _flag),
            "metadata": self._set_suite("metadata"),
            "trust_remote_code": self._set_engine("trust_remote_code", _flag),
            "max_model_len": self._set_engine("max_model_len", int),
            "enforce_eager": self._set_engine("enforce_eager", _flag),
            "dtype": self._set_engine("dtype", str),
            "kv_cache_dtype": self._set_engine("kv_cache_dtype", str),
            "moe_backend": self._engine_flag("--moe-backend"),
            "tokenizer_mode": self._engine_flag("--tokenizer-mode"),
            "env_vars": self._env,
            "backend": self._backend,
        }
        for key, value in self.raw.items():
            if key in NOT_APPLIED:
                self.notes.append(Note(self.path, key, f"not applied: {NOT_APPLIED[key]}"))
            elif key not in handlers:
                self.notes.append(Note(self.path, key, "unknown: vLLM's lm-eval harness does not read it; ignored"))
            else:
                try:
                    self.understood.append((key, handlers[key](value)))
                except (TypeError, ValueError) as exc:
                    raise ProfileError(f"{self.path}: {key}: {exc}") from exc
        return self._profile_fields()

    def _profile_fields(self) -> dict[str, Any]:
        for key in ("model_name", "tasks"):
            if key not in self.raw:
                raise ProfileError(f"{self.path}: {key}: missing; every vLLM lm-eval config has one")
        model = str(self.raw["model_name"])
        rtol = float(self.raw.get("rtol", DEFAULT_RTOL))
        tasks, baselines = [], {}
        for task in self.raw["tasks"]:
            if not isinstance(task, dict) or "name" not in task or not task.get("metrics"):
                raise ProfileError(f"{self.path}: tasks: each task needs `name` and `metrics`, got {task!r}")
            tasks.append({"name": str(task["name"]), "metrics": [str(m["name"]) for m in task["metrics"]]})
            for metric in task["metrics"]:
                name = f"{task['name']}:{metric['name']}"
                if len(name) > METRIC_NAME_LIMIT:
                    raise ProfileError(f"{self.path}: tasks: metric {name!r} is longer than {METRIC_NAME_LIMIT}")
                baselines[name] = {
                    "value": float(metric["value"]),
                    "direction": "higher",
                    "tolerance": {"kind": "relative", "value": rtol},
                    "source": (
                        f"vLLM lm-eval config {self.path.name}: ground truth {metric['value']}, "
                        f"rtol {rtol} (vLLM passes measured >= value * (1 - rtol))"
                    ),
                }
        self.suite["tasks"] = tasks
        return {
            "name": profile_name(self.path),
            "description": f"vLLM lm-eval config {self.path}, read as it is",
            "model": model,
            "served_model_name": _served_name(model),
            "engine": self.engine,
            "suites": [self.suite],
            "baselines": {LM_EVAL: baselines},
        }


def looks_like_vllm_config(raw: Any) -> bool:
    return isinstance(raw, dict) and "model_name" in raw and "tasks" in raw


def read_config(path: Path, tensor_parallel_size: int = 1) -> VllmConfig:
    """One vLLM config file as a profile; a file that cannot be one raises ProfileError."""
    raw = read_mapping(path, "a vLLM lm-eval config")
    if not re.match(NAME_PATTERN, profile_name(path)):
        raise ProfileError(f"{path}: the file name does not make a profile name matching {NAME_PATTERN}")
    reader = _Reader(path, raw, tensor_parallel_size)
    fields = reader.read()
    try:
        profile = Profile.model_validate(fields)
    except ValidationError as exc:
        raise ProfileError(f"{path}: {describe(exc)}") from exc
    except (KeyError, ValueError) as exc:
        raise ProfileError(f"{path}: {exc}") from exc
    return VllmConfig(path, profile, tuple(reader.understood), tuple(reader.notes))


def config_files(source: Path) -> list[Path]:
    """The files a source names: a config file, every config in a folder, or a `models-*.txt` list."""
    if source.is_dir():
        return sorted(p for p in source.glob("*.yaml") if looks_like_vllm_config(_peek(p)))
    if source.suffix == ".txt":
        lines = (line.strip() for line in source.read_text().splitlines())
        return [source.parent / line for line in lines if line and not line.startswith("#")]
    if source.is_file():
        return [source]
    raise ProfileError(f"vLLM config source {source} does not exist")


def _peek(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {"model_name": None, "tasks": None}  # let read_config report it


def load_configs(sources: list[Path], tensor_parallel_size: int = 1) -> tuple[dict[str, VllmConfig], list[str]]:
    """Every config the sources name, by profile name, and the files that could not be read.

    A file that cannot become a profile is reported and left out rather than failing the
    rest: a vLLM checkout holds configs for hardware and backends a host may not have.
    """
    found: dict[str, VllmConfig] = {}
    problems: list[str] = []
    for source in sources:
        try:
            files = config_files(source)
        except (OSError, ProfileError) as exc:
            problems.append(str(exc))
            continue
        for path in files:
            try:
                config = read_config(path, tensor_parallel_size)
            except ProfileError as exc:
                problems.append(str(exc))
                continue
            other = found.get(config.profile.name)
            if other is not None and other.path.resolve() != path.resolve():
                problems.append(f"{path}: profile name {config.profile.name!r} is also {other.path}; left out")
                continue
            found[config.profile.name] = config
    return found, problems
