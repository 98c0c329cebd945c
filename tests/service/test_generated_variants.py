"""Generated mutants as variants: the plugin, an arm, the engine's environment and a mutation
batch take a kept id as they take a catalogued mutant; unknown ids are refused with where the
variants are listed. No engine, no kernel run (tests/kernels/test_generated_mutants.py runs them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from kernels import mutants
from kernels.generated_mutants import manifest
from kernels.vllm_plugin import PluginConfig
from service import baselines
from service.arms import apply, plan
from service.db.migrate import upgrade
from service.db.models import Run
from service.db.session import session_scope
from service.engine.launcher import build_env
from service.profile_catalog import configured_profiles
from service.profiles import MAX_ARMS, ArmSpec, RunOverrides, load_profile
from service.runs import mutation
from service.schemas import RunCreate
from service.settings import PACKAGED_PROFILES, Settings

HELD_OUT = manifest().half("held-out")
TUNING = manifest().half("tuning")


def test_the_plugin_an_arm_and_the_engine_take_a_held_out_id() -> None:
    chosen = HELD_OUT[0]
    config = PluginConfig.from_env({"KVCANARY_KERNEL_VARIANT": chosen})
    assert config is not None and config.variant == chosen
    profile = load_profile(PACKAGED_PROFILES / "drift-tiny-cpu-triton.yaml")
    arm = ArmSpec.model_validate(f"{chosen},max_num_batched_tokens=64")
    assert (arm.variant, arm.name) == (chosen, f"{chosen},max_num_batched_tokens=64")
    served = apply(profile, arm)
    env = build_env(served, receipt_dir=Path("receipts"), base_env={})
    assert env["KVCANARY_KERNEL_VARIANT"] == chosen and env["TRITON_INTERPRET"] == "1"
    assert [a.name for a in plan(profile, RunOverrides(), [ArmSpec(variant="fixed"), arm], None).arms] == [
        "fixed",
        arm.name,
    ]
    overrides = RunOverrides.model_validate({"kernel_variant": TUNING[0]})
    assert overrides.kernel_variant == TUNING[0]


def test_unknown_ids_are_refused_with_where_the_variants_are_listed() -> None:
    with pytest.raises(ValueError, match=r"kernels/generated_mutants\.json") as refused:
        PluginConfig.from_env({"KVCANARY_KERNEL_VARIANT": "gen_no_such_site_0"})
    assert "KVCANARY_KERNEL_VARIANT='gen_no_such_site_0' is no kernel variant" in str(refused.value)
    with pytest.raises(ValidationError):
        ArmSpec.model_validate("gen_no_such_site_0")


def test_either_half_fits_one_run_and_queues_as_a_mutation_batch(tmp_path: Path) -> None:
    assert len(TUNING) + 1 < MAX_ARMS and len(HELD_OUT) + 1 < MAX_ARMS
    for half in (TUNING, HELD_OUT):
        assert RunCreate.model_validate({"profile": "gsm8k-tiny-cpu", "compare": ["fixed", *half]}).compare
    settings = Settings(data_dir=tmp_path / "data", profiles_dir=PACKAGED_PROFILES, start_worker=False)
    url = settings.resolved_database_url()
    upgrade(url)
    profiles = configured_profiles(settings)
    chosen = mutants.batch(None, "held-out")
    assert chosen == HELD_OUT
    with session_scope(url) as session:
        baselines.seed_from_profiles(session, profiles)
        run_id = mutation.enqueue_batch(session, profiles["drift-tiny-cpu-triton"], chosen, "b1", {}, "test")
    with session_scope(url, write=False) as session:
        run = session.get(Run, run_id)
        assert run is not None and [a["name"] for a in run.arms] == ["fixed", *HELD_OUT]
        assert run.expect == {"fixed": "pass", **dict.fromkeys(HELD_OUT, "fail")}
        assert run.overrides == {}  # generated mutants arm no canary
        matrix = mutation.compute_matrix(
            session, "drift-tiny-cpu-triton", "b1", run_id, ["drift"], turning_points=False
        )
    assert [row.mutant for row in matrix.rows] == sorted(HELD_OUT)
    row = matrix.rows[0]
    assert row.condition.startswith("generated, held-out half: ")
    assert manifest().kept[row.mutant].before in row.condition


def test_the_cli_runs_a_half_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    env = {**os.environ, "KVCANARY_DATA_DIR": str(tmp_path), "KVCANARY_PROFILES_DIR": str(PACKAGED_PROFILES)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "service", "mutants", *args]
        return subprocess.run(command, env={**env, "COLUMNS": "400"}, capture_output=True, text=True)

    wrong = cli("--half", "both", "drift-tiny-cpu-triton")
    assert wrong.returncode == 2 and "half must be one of tuning, held-out" in wrong.stderr
    unknown = cli("--mutant", "gen_no_such_site_0", "drift-tiny-cpu-triton")
    assert unknown.returncode == 2 and "generated_mutants.json" in unknown.stderr


def test_the_kill_rate_counts_caught_and_dead_arms_and_lists_survivors_apart_from_unreached() -> None:
    """kill_rate.py's report over a matrix and run documents as the API returns them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
    import kill_rate

    caught, dead, survivor, unreached = HELD_OUT[:4]

    def cell(suite: str, state: str) -> mutation.MatrixCell:
        return mutation.MatrixCell(suite=suite, state=state)

    states = {caught: ("caught", "missed"), dead: ("died", "died"), survivor: ("missed", "missed")}
    states[unreached] = ("missed", "missed")
    rows = [
        mutation.MatrixRow(
            mutant=name,
            run_id=7,
            status="failed",
            condition="",
            served="",
            cells={"drift": cell("drift", drift), "gsm8k": cell("gsm8k", gsm8k)},
        )
        for name, (drift, gsm8k) in states.items()
    ]
    matrix = mutation.MutationMatrix(
        profile="mutants-tiny-gpu", batch="b", suites=["drift", "gsm8k"], rows=rows, caught=2, judged=4
    )

    def metric(arm: str, suite: str, value: float, excess: float = 0.0) -> dict[str, object]:
        name = "kl" if suite == "drift" else "strict-match"
        return {"arm": arm, "suite": suite, "metric": name, "value": value, "verdict": "pass",
                "details": {"dlogprob_excess": excess} if suite == "drift" else {}}  # fmt: skip

    metrics = [metric("fixed", "drift", 0.0), metric("fixed", "gsm8k", 0.99)]
    metrics += [metric(survivor, "drift", 3e-5, 4e-4), metric(survivor, "gsm8k", 0.99)]
    metrics += [metric(unreached, "drift", 0.0), metric(unreached, "gsm8k", 0.99)]
    text = kill_rate.report(kill_rate.FIXTURE_NAMES["triton-attn-llama"], "held-out", matrix, {7: {"metrics": metrics}})
    assert "| drift | 2 | 3 | 67% |" in text and "| gsm8k | 1 | 3 | 33% |" in text
    assert "| **any suite** | **2** | **3** | **67%** |" in text
    survivors, not_reached = text.split("Survivors:")[1].split("Not reached when served:")
    assert f"`{survivor}`" in survivors and "drift.kl 3e-05 (fixed 0)" in survivors and "0.0004" in survivors
    assert manifest().kept[survivor].before in survivors
    assert f"`{unreached}`" in not_reached and f"`{unreached}`" not in survivors
    assert "1 computed fixed's numbers when served" in text
