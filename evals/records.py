"""What a suite produces and a run stores: one evaluated item (`Sample`) and one score (`MetricValue`).

At the bottom of `evals/`: the metric kinds read samples, the suites make them and the service
stores them, so all three import this module and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One evaluated item, the same from suite to store to API: `correct` holds the 0/1 flags of
    accuracy metrics; whatever else a metric kind keeps per item (word counts, per-item scores, drift
    rows) lives in `data`, under the names its module (`evals.kinds.<kind>`) gives it."""

    key: str
    prompt_hash: str
    target: str
    response: str
    extracted: Mapping[str, str] = field(default_factory=dict)
    correct: Mapping[str, bool] = field(default_factory=dict)
    prompt: str = ""
    error: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)  # what each metric kind keeps, by its own names


@dataclass(frozen=True)
class MetricValue:
    """One score a suite reports; `direction` says which way is better."""

    name: str
    value: float
    n: int
    stderr: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    direction: str = "higher"
