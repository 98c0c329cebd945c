"""The gate's re-judgement of stored runs gives samples stored before the control rules what those
rules read (`gate_rejudge.backfill`): an invariance run of `fixed` and `batch_row_shift` as an H100
stored it (rows shaped on its measured numbers, docs/gpu-gate.md), re-judged from a real SQLite
database. Before the backfill the mutant is judged by its moved floors (inconclusive); after it,
against the control arm's same conditions (fail)."""

from __future__ import annotations

import importlib
import random
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import select

from evals import suites as suite_registry
from evals.invariance import row
from evals.logprob_drift import PromptDrift
from evals.records import Sample
from service.db.migrate import upgrade
from service.db.models import Run
from service.db.session import session_scope
from service.profiles import load_profiles
from service.runs import store
from service.settings import PACKAGED_PROFILES

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
gate_rejudge = importlib.import_module("gate_rejudge")

MUTANT = "batch_row_shift"


def _drift(kl: float, first: int | None) -> PromptDrift:
    return PromptDrift(first, True, 0.0, kl, 10 * kl, 1.0 if first is None else 0.9, 0.0, True)


def _sample(key: str, conditions: dict[str, Any]) -> Sample:
    data = {"conditions": conditions, "prompt_len": 320, "finite": True, "kl_tolerance": 2e-4, "control": None}
    return Sample(key=key, prompt_hash=key, target="", response="", data=data)


def test_a_stored_run_gets_the_control_rows_and_the_engine_change_and_is_judged_against_the_control(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'gate.db'}"
    upgrade(url)
    profile = load_profiles(PACKAGED_PROFILES)["invariance-tiny-gpu"]
    rng = random.Random(0)
    arms = [{"name": name, "variant": name, "engine": {}} for name in ("fixed", MUTANT)]
    with session_scope(url) as session:
        run = Run(profile=profile.name, status="failed", trigger="manual", arms=arms)
        session.add(run)
        session.flush()
        zero = row((_drift(0.0, None), 40), (_drift(0.0, None), 40))
        store.save_samples(session, run.id, "fixed", "invariance", "kl",
                           [_sample(f"p{i:02d}", {"batch": zero}) for i in range(16)])  # fmt: skip
        moved = [
            _sample(f"p{i:02d}", {"batch": row((_drift(0.0874 * (0.2 + 1.6 * rng.random()), 321), 40),
                                               (_drift(0.0805 * (0.2 + 1.6 * rng.random()), 330), 40))})
            for i in range(16)
        ]  # fmt: skip
        store.save_samples(session, run.id, MUTANT, "invariance", "kl", moved)
        run_id = run.id
    kind = suite_registry.metric_kind("invariance", "kl")
    with session_scope(url) as session:
        before = kind.scores(store.load_samples(session, run_id, MUTANT, "invariance"), "kl")
        assert kind.judge("invariance", "kl", before, None).verdict == "inconclusive"
        run = session.scalars(select(Run).where(Run.id == run_id)).one()
        assert gate_rejudge.backfill(session, run, profile, kernel_only=False) == 16
    with session_scope(url) as session:
        stored = store.load_samples(session, run_id, MUTANT, "invariance")
        assert all(s.data["engine_change"] == {} for s in stored.values())
        assert all(s.data["conditions"]["batch"]["control"]["drift"]["mean_kl"] == 0.0 for s in stored.values())
        judged = kind.judge("invariance", "kl", kind.scores(stored, "kl"), None)
        assert judged.verdict == "fail" and judged.details["batch.decided_by"] == "control_kl", judged.explanation
        run = session.scalars(select(Run).where(Run.id == run_id)).one()
        assert gate_rejudge.backfill(session, run, profile, kernel_only=False) == 0  # once is enough
