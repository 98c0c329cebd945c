"""Invariance samples through the store, the run diff API and the samples page (real SQLite file)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from evals.invariance import row, skipped
from evals.logprob_drift import PromptDrift
from evals.records import Sample
from service.settings import Settings
from tests.service.test_compare import add_run, client, settings  # noqa: F401 (fixtures)


def _drift(kl: float, first: int | None = None) -> PromptDrift:
    return PromptDrift(first, True, 0.0, kl, kl, 1.0, 0.0, True)


def _sample(key: str, conditions: dict[str, Any]) -> Sample:
    data = {"conditions": conditions, "prompt_len": 10, "finite": True, "kl_tolerance": 0.01, "tokens": [1, 2]}
    return Sample(
        key=key, prompt_hash=key, target="", response="2 tokens", prompt=f"Question: {key}?\nAnswer:", data=data
    )


def test_conditions_show_per_prompt_and_diff_by_condition(client: TestClient, settings: Settings) -> None:  # noqa: F811
    steady = row((_drift(0.001), 9), (_drift(0.001), 9))
    moved = row((_drift(0.4, first=13), 9), (_drift(0.001), 9))
    off = skipped("the engine serves without prefix caching")
    a = [_sample(k, {"prefix_hit": steady, "batch": steady, "long_context": off}) for k in ("p0", "p1")]
    b = [_sample("p0", {"prefix_hit": moved, "batch": steady, "long_context": off}),
         _sample("p1", {"prefix_hit": steady, "batch": steady, "long_context": off})]  # fmt: skip
    run = add_run(settings, {("stock", "invariance"): a, ("fixed", "invariance"): b}, arms=["stock", "fixed"])

    diff = client.get(f"/api/v1/runs/{run}/diff/{run}", params={"arm_a": "stock", "arm_b": "fixed"}).json()
    [suite] = diff["suites"]
    assert suite["kind"] == "invariance" and suite["invariance"]["matched"] == 2
    changes = {c["condition"]: c for c in suite["invariance"]["conditions"]}
    assert set(changes) == {"prefix_hit", "batch"}  # skipped in both: nothing to compare
    assert (changes["prefix_hit"]["diverged_b"], changes["prefix_hit"]["newly_diverged"]) == (1, ["p0"])

    listed = client.get(f"/api/v1/runs/{run}/samples", params={"suite": "invariance", "arm": "fixed"}).json()
    assert [s["key"] for s in listed["items"]] == ["p0", "p1"]  # the prompt that moved first
    page = client.get(f"/runs/{run}/samples", params={"suite": "invariance", "arm": "fixed"})
    assert page.status_code == 200, page.text
    assert 'data-condition="prefix_hit"' in page.text and "first at 13" in page.text
    assert 'title="the engine serves without prefix caching">skipped' in page.text
    compared = client.get(f"/compare/{run}/{run}", params={"arm_a": "stock", "arm_b": "fixed"})
    assert compared.status_code == 200 and 'data-condition="prefix_hit"' in compared.text, compared.text[-2000:]
