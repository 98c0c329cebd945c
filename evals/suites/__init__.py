"""Suite registry: a new suite is one new module listed in `_MODULES`, nothing else."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from evals.registry import Registry
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


# Each module exposes `DEFINITION` and imports heavy code lazily.
REGISTRY: Registry[SuiteDefinition] = Registry("suite", _MODULES, "DEFINITION", lambda definition: definition.name)
registry = REGISTRY.all
get = REGISTRY.get


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
    """A stored metric's value as its kind writes it (`evals.numbers`' format)."""
    return stored_kind(suite, metric).display(value, details, missing)
