"""The GPU gate's `share` group, what a CPU can check of it: the runs it queues are runs the service
admits (fixed, every mutant, fixed again on the same engine arguments; fresh or shared), and the
comparison it prints flags differing verdicts, a prefix-cache hit after a reset and an unshared run.
The A/A rows ask for fresh engines. The runs themselves need a GPU host (docs/gpu-gate.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from kernels.mutants import MUTANTS
from service.arms import apply
from service.profiles import ArmSpec, RunOverrides, load_profile
from service.runs.admission import admit
from service.runs.shared_engines import fresh_reason
from service.schemas import RunCreate
from service.settings import PACKAGED_PROFILES

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts" / "gpu"))
import gate_e2e
import gate_share


@pytest.mark.parametrize("profile", gate_share.PROFILES)
@pytest.mark.parametrize("mode", gate_share.MODES)
def test_the_share_runs_are_admitted_and_share_one_engine_when_shared(profile: str, mode: str) -> None:
    body = gate_share.request(profile, mode)
    assert body["labels"] == {"gate": f"share-{mode}"}  # not a mutation batch of the matrix
    created = RunCreate.model_validate(body)
    loaded = load_profile(PACKAGED_PROFILES / f"{profile}.yaml")
    overrides = RunOverrides.model_validate(body["overrides"])
    arms = [ArmSpec.model_validate(arm) for arm in body["compare"]]
    admitted = admit(loaded, overrides, arms, created.expect, on_this_host=False)
    assert [arm.name for arm in admitted.plan.arms] == ["fixed", *MUTANTS, gate_share.FIXED_AGAIN]
    executed = admitted.profile
    assert executed.arm_engines == mode
    pairs = [(arm.name, apply(executed, arm)) for arm in arms]
    reasons = [fresh_reason(pairs, i) for i in range(len(pairs))]
    if mode == "shared":  # eager profiles, one set of canaries: every arm after the first switches
        assert reasons[1:] == [None] * (len(pairs) - 1), reasons
    else:
        assert all("arm_engines: fresh" in str(reason) for reason in reasons[1:]), reasons


def _run(engines: list[list[str]], verdict: str = "fail", after: float = 0.0) -> dict[str, Any]:
    arms = [arm for group in engines for arm in group]
    engine: dict[str, Any] = {}
    for number, group in enumerate(engines, 1):
        for i, arm in enumerate(group):
            cache = {"caching": True, "hits_before_reset": 480.0, "hits_after_reset": after}
            use = {"engine": number, "switch": {"generation": i, "prefix_cache": cache}} if i else {"engine": number}
            engine[arm] = {"engine_use": use}
    metrics = [{"arm": arm, "suite": "drift", "metric": "kl", "verdict": "pass" if arm == "fixed" else verdict}
               for arm in arms]  # fmt: skip
    timings = {"fixed.engine_start_s": 60.0, "a.engine_switch_s": 2.0}
    return {"variants": arms, "metrics": metrics, "engine": engine, "engine_groups": engines, "timings": timings,
            "arm_verdicts": {}}  # fmt: skip


def test_the_comparison_flags_what_the_share_rows_must_not_show() -> None:
    fresh = _run([["fixed"], ["a"], ["b"]])
    shared = _run([["fixed", "a", "b"]])
    assert gate_share.problems(fresh, shared) == []
    assert gate_share.timings(shared) == (1, 60.0, 1, 2.0)
    assert gate_share.probes(shared) == [
        "switch 1 to a: 480 tokens hit before the reset, 0 after",
        "switch 2 to b: 480 tokens hit before the reset, 0 after",
    ]
    found = gate_share.problems(fresh, _run([["fixed", "a"], ["b"]], verdict="pass", after=16.0))
    assert [line.split(": fresh")[0] for line in found] == ["verdicts differ: a", "verdicts differ: b", found[2]]
    assert "('drift', 'kl', 'fail')" in found[0] and "shared [('drift', 'kl', 'pass')" in found[0]
    assert found[2] == "a: the prefix cache hit after the reset"
    assert gate_share.problems(fresh, fresh) == ["shared mode started 3 engines for 3 arms"]


def test_the_aa_rows_ask_for_fresh_engines() -> None:
    for row in gate_e2e.rows():
        if row.group in ("aa", "ab5"):
            assert row.args.count("--fresh-engines") == 1, row.key


def test_the_tp2_share_row_wants_both_workers_switched() -> None:
    def receipts(generation: int) -> list[dict[str, Any]]:
        return [{"runs_model": True, "switch": {"generation": generation}} for _ in range(2)]

    run = {
        "engine_groups": [["stock", "fixed"]],
        "engine": {"stock": {"receipts": receipts(0)}, "fixed": {"receipts": receipts(1)}},
    }
    assert gate_e2e._switched(run, ["stock", "fixed"], workers=2) == []
    run["engine"]["fixed"]["receipts"][1]["switch"] = {"generation": 0}
    assert gate_e2e._switched(run, ["stock", "fixed"], workers=2) == [
        "fixed: 1 of 2 model processes switched to generation 1"
    ]
    assert gate_e2e._switched({**run, "engine_groups": [["stock"], ["fixed"]]}, ["stock", "fixed"], 2) != []
