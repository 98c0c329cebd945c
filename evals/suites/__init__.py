"""Suite registry: a third suite is one new module listed in `_MODULES`, nothing else."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from evals.suites.base import SuiteDefinition

if TYPE_CHECKING:  # the kinds compute with numpy; the bare client install has none
    from evals.kinds import MetricKind

_MODULES = (
    "evals.suites.gsm8k",
    "evals.suites.lmeval",
    "evals.suites.wer",
    "evals.suites.drift",
    "evals.suites.invariance",
    "evals.suites.recall",
)


def registry() -> dict[str, SuiteDefinition]:
    """Every suite by name; each module exposes `DEFINITION` and imports heavy code lazily."""
    found: dict[str, SuiteDefinition] = {}
    for module_name in _MODULES:
        definition: SuiteDefinition = importlib.import_module(module_name).DEFINITION
        found[definition.name] = definition
    return found


def get(name: str) -> SuiteDefinition:
    suites = registry()
    if name not in suites:
        raise KeyError(f"unknown suite {name!r}; known suites: {', '.join(sorted(suites))}")
    return suites[name]


def metric_kind(suite: str, metric: str) -> MetricKind:
    """The declared kind of one metric of a registered suite."""
    return get(suite).kind_of(metric)


def stored_kind(suite: str, metric: str) -> MetricKind:
    """The kind of a stored result's metric; one of a suite or metric no longer registered reads as
    a plain number (accuracy's)."""
    from evals import kinds

    try:
        return metric_kind(suite, metric)
    except KeyError:
        return kinds.get("accuracy")


def shown(suite: str, metric: str, value: float | None, details: Mapping[str, Any] | None, missing: str = "-") -> str:
    """A stored metric's value as its kind writes it (`service.numbers`' format)."""
    return stored_kind(suite, metric).display(value, details, missing)
