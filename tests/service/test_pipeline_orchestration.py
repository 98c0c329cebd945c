"""The pipeline's orchestration, without vLLM: which arm runs when, what is stored as it comes, how a
death, a cancel or a lost claim ends a run, and which arm's judgement decides.

The engine is a stand-in (tests/service/stand_in_engine.py) because these tests are about what
the pipeline does around an engine; the suite (lm-eval's GSM8k on the fixture data), the
database and the scoring are the real ones. Real engines run the same pipeline in the engine
tier (test_gate_e2e.py, test_cli_run.py, test_engine_death.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select

from evals.fixtures.gsm8k_data import FEWSHOT_FILE, TEST_FILE
from service import baselines
from service.db.migrate import upgrade
from service.db.models import Run, RunEvent, SuiteResult
from service.db.models import Sample as SampleRow
from service.db.session import session_scope
from service.profile_snapshot import snapshot_of
from service.profiles import ArmSpec, Profile
from service.runs import pipeline, queue
from service.runs.context import RunContext, RunLost
from service.runs.state import Status, transition
from service.settings import Settings
from tests.conftest import MakeProfile
from tests.service.stand_in_engine import Behaviour, StandInEngines

WORKER = "test-worker"
TOLERANCE = {"kind": "absolute", "value": 0.5}  # wide enough for four answers to decide
BASELINES = {"gsm8k": {m: {"value": 1.0, "tolerance": TOLERANCE} for m in ("strict-match", "flexible-extract")}}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'kvcanary.db'}"
    upgrade(url)
    return url


def gsm8k_profile(make_profile: MakeProfile, limit: int = 4, **fields: Any) -> Profile:
    suite = {"suite": "gsm8k", "num_fewshot": 0, "limit": limit, "concurrency": 1}
    suite |= {"test_file": str(TEST_FILE), "fewshot_file": str(FEWSHOT_FILE)}
    return make_profile("stand-in-model", name="orchestration", suites=[suite], **{"baselines": BASELINES, **fields})


def claimed(
    url: str, tmp_path: Path, profile: Profile, arms: Sequence[str] = (), expect: dict[str, str] | None = None
) -> tuple[Settings, int]:
    """A run of `profile` queued as a trigger queues it, claimed by WORKER."""
    settings = Settings(database_url=url, data_dir=tmp_path / "data", start_worker=False)
    with session_scope(url) as session:
        baselines.seed_from_profiles(session, {profile.name: profile})
        run, _ = queue.enqueue(
            session, profile=profile.name, trigger="ci", triggered_by="test", labels={}, overrides={},
            arms=[ArmSpec.model_validate(a).stored() for a in arms], expect=expect, max_attempts=2,
            profile_snapshot=snapshot_of(profile),
        )  # fmt: skip
        session.flush()
        queue.claim_next(session, WORKER, run.id)
        return settings, run.id


def context_of(settings: Settings, run_id: int, profile: Profile, engines: StandInEngines) -> RunContext:
    return RunContext.open(run_id, settings, {profile.name: profile}, WORKER, engines)


def in_background(context: RunContext) -> tuple[threading.Thread, list[str]]:
    ended: list[str] = []
    thread = threading.Thread(target=lambda: ended.append(pipeline.execute(context)), daemon=True)
    thread.start()
    return thread, ended


def until(check: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def row(url: str, run_id: int) -> Run:
    with session_scope(url, write=False) as session:
        run = session.get(Run, run_id)
        assert run is not None
        return run


def samples(url: str, run_id: int, arm: str | None = None) -> int:
    where = [SampleRow.run_id == run_id] + ([SampleRow.arm == arm] if arm else [])
    with session_scope(url, write=False) as session:
        return session.scalar(select(func.count()).select_from(SampleRow).where(*where)) or 0


def results(url: str, run_id: int) -> dict[tuple[str, str], SuiteResult]:
    with session_scope(url, write=False) as session:
        rows = session.scalars(select(SuiteResult).where(SuiteResult.run_id == run_id))
        return {(r.arm, r.metric): r for r in rows}


def events(url: str, run_id: int) -> list[tuple[str, str]]:
    with session_scope(url, write=False) as session:
        rows = session.execute(select(RunEvent.kind, RunEvent.message).where(RunEvent.run_id == run_id))
        return [(kind, message) for kind, message in rows.all()]


# one arm


def test_a_run_goes_through_its_states_stores_every_answer_and_passes(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile)
    settings, run_id = claimed(sqlite_url, tmp_path, profile)
    engines = StandInEngines()
    assert pipeline.execute(context_of(settings, run_id, profile, engines)) == "passed"
    kinds = [kind for kind, _ in events(sqlite_url, run_id) if kind.startswith("status:")]
    assert kinds == ["status:queued", "status:starting_engine", "status:running", "status:scoring", "status:passed"]
    run = row(sqlite_url, run_id)
    assert (run.progress_done, run.progress_total, run.progress_phase) == (4, 4, "gsm8k")
    assert run.engine["fixed"]["version"] == "stand-in" and run.worker_id is None and run.engine_pid is None
    assert set(run.timings) == {"fixed.engine_start_s", "fixed.gsm8k_s"}
    assert samples(sqlite_url, run_id) == 4
    assert {key: r.verdict for key, r in results(sqlite_url, run_id).items()} == {
        ("fixed", "strict-match"): "pass",
        ("fixed", "flexible-extract"): "pass",
    }
    assert [engine.answered for engine in engines.started] == [4] and engines.started[0].url  # one engine, stopped


def test_wrong_answers_fail_the_run_and_the_summary_names_the_metric(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile)
    settings, run_id = claimed(sqlite_url, tmp_path, profile)
    engines = StandInEngines({"fixed": Behaviour(answers="wrong")})
    assert pipeline.execute(context_of(settings, run_id, profile, engines)) == "failed"
    run = row(sqlite_url, run_id)
    assert run.verdict == "fail" and "gsm8k.strict-match 0.0000: fail" in run.verdict_summary
    assert run.arm_verdicts == {"fixed": "fail"}


def test_empty_answers_fail_the_metric_whatever_its_score(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile, baselines={})  # no baseline: only the empty rate can fail it
    settings, run_id = claimed(sqlite_url, tmp_path, profile)
    engines = StandInEngines({"fixed": Behaviour(answers="empty")})
    assert pipeline.execute(context_of(settings, run_id, profile, engines)) == "failed"
    judged = results(sqlite_url, run_id)[("fixed", "strict-match")]
    assert judged.verdict == "fail" and judged.empty_response_rate == 1.0
    assert judged.explanation.startswith("100.0% of responses were empty, over the limit of 20.0%")


def test_a_single_arm_whose_engine_dies_ends_in_error_keeping_its_answers(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile)
    settings, run_id = claimed(sqlite_url, tmp_path, profile)
    engines = StandInEngines({"fixed": Behaviour(die_after=2)})
    assert pipeline.execute(context_of(settings, run_id, profile, engines)) == "error"
    run = row(sqlite_url, run_id)
    assert run.error.startswith("EngineDied: ") and "stopped answering after 2 answers" in run.error
    assert "stopped answering after 2 answers" in run.log_tail
    assert samples(sqlite_url, run_id) == 2 and results(sqlite_url, run_id) == {}


def test_an_engine_that_exits_at_start_up_is_a_death_at_start_up(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile)
    settings, run_id = claimed(sqlite_url, tmp_path, profile)
    engines = StandInEngines({"fixed": Behaviour(exit_at_start=1)})
    assert pipeline.execute(context_of(settings, run_id, profile, engines)) == "error"
    assert "at start-up, before /health answered" in row(sqlite_url, run_id).error


# A/B


def test_arms_run_in_turn_and_the_treatment_is_paired_with_the_control(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile)
    settings, run_id = claimed(sqlite_url, tmp_path, profile, ["fixed", "legacy"], {"legacy": "fail"})
    engines = StandInEngines({"legacy": Behaviour(answers="wrong")})
    assert pipeline.execute(context_of(settings, run_id, profile, engines)) == "failed"
    [engine] = engines.started  # one engine, switched to legacy after fixed
    assert engine.arms == ["fixed", "legacy"] and engine._server is None
    run = row(sqlite_url, run_id)
    assert run.arm_verdicts == {"fixed": "pass", "legacy": "fail"} and run.outcome == "as_expected"
    assert run.progress_phase == "legacy/gsm8k" and set(run.engine) == {"fixed", "legacy"}
    judged = results(sqlite_url, run_id)
    assert judged[("fixed", "strict-match")].verdict == "pass"
    treatment = judged[("legacy", "strict-match")]
    assert treatment.verdict == "fail" and any(key.startswith("paired_") for key in treatment.details)
    assert samples(sqlite_url, run_id, "fixed") == samples(sqlite_url, run_id, "legacy") == 4


def test_without_a_baseline_the_pairing_alone_judges_the_treatment(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile, baselines={})
    settings, run_id = claimed(sqlite_url, tmp_path, profile, ["fixed", "legacy"])
    assert pipeline.execute(context_of(settings, run_id, profile, StandInEngines())) == "passed"
    judged = results(sqlite_url, run_id)
    assert judged[("fixed", "strict-match")].verdict == "no_baseline"
    assert judged[("legacy", "strict-match")].verdict != "no_baseline"
    # the control's own no_baseline does not decide an A/B run: only the treatment is in the summary
    summary = row(sqlite_url, run_id).verdict_summary
    assert "legacy/gsm8k.strict-match" in summary and "fixed/" not in summary


def test_one_arms_engine_dying_leaves_the_other_judged_and_the_run_in_error(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile)
    settings, run_id = claimed(sqlite_url, tmp_path, profile, ["fixed", "legacy"])
    engines = StandInEngines({"fixed": Behaviour(die_after=1)})
    assert pipeline.execute(context_of(settings, run_id, profile, engines)) == "error"
    run = row(sqlite_url, run_id)
    assert run.arm_verdicts == {"fixed": "error", "legacy": "pass"}
    assert run.verdict == "pass" and run.error.startswith("EngineDied: ") and "arm 'fixed'" in run.error
    assert [kind for kind, _ in events(sqlite_url, run_id)].count("arm_error") == 1
    assert {arm for arm, _ in results(sqlite_url, run_id)} == {"legacy"}  # judged against the baseline alone
    assert [engine.arms for engine in engines.started] == [["fixed"], ["legacy"]]  # a fresh one after the death
    said = [message for _, message in events(sqlite_url, run_id)]
    assert "arm legacy: engine 2 starts (the engine of arm fixed is gone)" in said


# shared engines


def test_arms_share_an_engine_unless_their_arguments_differ_or_the_run_asks_for_fresh_ones(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    """fixed, legacy and stock switch on one engine; the arm with its own prefill budget starts
    another; the run document says which engine each arm ran on. With arm_engines: fresh every arm
    starts its own."""
    profile = gsm8k_profile(make_profile)
    arms = ["fixed", "legacy", "stock", "fixed,max_num_batched_tokens=64"]
    settings, run_id = claimed(sqlite_url, tmp_path, profile, arms)
    engines = StandInEngines({"legacy": Behaviour(answers="wrong")})
    assert pipeline.execute(context_of(settings, run_id, profile, engines)) == "failed"
    assert [engine.arms for engine in engines.started] == [arms[:3], arms[3:]]
    assert [engine.switchable for engine in engines.started] == [True, False]  # nothing after the last arm
    use = {arm: facts["engine_use"] for arm, facts in row(sqlite_url, run_id).engine.items()}
    assert [use[arm]["engine"] for arm in arms] == [1, 1, 1, 2]
    assert use["legacy"]["started_for"] == use["stock"]["started_for"] == "fixed" and "switch" in use["stock"]
    assert "max_num_batched_tokens" not in use["fixed"]["fresh"]
    assert "--max-num-batched-tokens 64" in use[arms[3]]["fresh"] and "differ from arm stock" in use[arms[3]]["fresh"]
    assert row(sqlite_url, run_id).arm_verdicts == {"fixed": "pass", "legacy": "fail", "stock": "pass", arms[3]: "pass"}

    failing = StandInEngines({"legacy": Behaviour(switch_fails=True)})  # the arm after it shares again
    settings, run_id = claimed(sqlite_url, tmp_path / "failing", profile, ["fixed", "legacy", "stock"])
    assert pipeline.execute(context_of(settings, run_id, profile, failing)) == "passed"
    assert [engine.arms for engine in failing.started] == [["fixed"], ["legacy", "stock"]]
    reason = row(sqlite_url, run_id).engine["legacy"]["engine_use"]["fresh"]
    assert reason == "switching arm fixed's engine failed: stand-in engine: the switch to arm legacy failed"

    fresh = gsm8k_profile(make_profile, arm_engines="fresh")
    settings, run_id = claimed(sqlite_url, tmp_path / "fresh", fresh, arms[:2])
    engines = StandInEngines()
    assert pipeline.execute(context_of(settings, run_id, fresh, engines)) == "passed"
    assert [engine.arms for engine in engines.started] == [["fixed"], ["legacy"]]
    assert "arm_engines: fresh" in row(sqlite_url, run_id).engine["legacy"]["engine_use"]["fresh"]


# while it runs


def test_answers_are_stored_as_they_come_not_at_the_end(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile, limit=10)
    settings, run_id = claimed(sqlite_url, tmp_path, profile)
    thread, ended = in_background(
        context_of(settings, run_id, profile, StandInEngines({"fixed": Behaviour(delay_s=0.4)}))
    )
    until(lambda: samples(sqlite_url, run_id) > 0)
    assert samples(sqlite_url, run_id) < 10 and row(sqlite_url, run_id).status == "running"
    thread.join(60)
    assert ended == ["passed"] and samples(sqlite_url, run_id) == 10


def test_a_cancel_stops_the_suite_and_the_engine(sqlite_url: str, tmp_path: Path, make_profile: MakeProfile) -> None:
    profile = gsm8k_profile(make_profile, limit=20)
    settings, run_id = claimed(sqlite_url, tmp_path, profile)
    engines = StandInEngines({"fixed": Behaviour(delay_s=0.2)})
    thread, ended = in_background(context_of(settings, run_id, profile, engines))
    until(lambda: row(sqlite_url, run_id).progress_done > 0)
    with session_scope(sqlite_url) as session:
        run = session.get(Run, run_id)
        assert run is not None
        queue.request_cancel(session, run, "test")
    thread.join(60)
    assert ended == ["cancelled"] and row(sqlite_url, run_id).error == ""
    assert ("status:cancelled", "cancelled while suites ran") in events(sqlite_url, run_id)
    assert engines.started[0].answered < 20 and engines.started[0]._server is None


def test_a_resumed_attempt_reuses_the_answers_an_earlier_one_stored(
    sqlite_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile)
    settings, run_id = claimed(sqlite_url, tmp_path, profile)
    assert (
        pipeline.execute(context_of(settings, run_id, profile, StandInEngines({"fixed": Behaviour(die_after=3)})))
        == "error"
    )
    with session_scope(sqlite_url) as session:  # as if it had been interrupted and re-queued
        run = session.get(Run, run_id)
        assert run is not None
        run.status = Status.QUEUED.value
        queue.claim_next(session, WORKER, run_id)
    engines = StandInEngines()
    assert pipeline.execute(context_of(settings, run_id, profile, engines)) == "passed"
    assert engines.started[0].answered == 1
    assert ("resume", "fixed/gsm8k: reusing 3 samples stored by an earlier attempt") in events(sqlite_url, run_id)


# ownership: SQLite and PostgreSQL


def test_a_run_taken_from_this_worker_ends_interrupted_and_nothing_more_is_written(
    database_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile, limit=20)
    settings, run_id = claimed(database_url, tmp_path, profile)
    engines = StandInEngines({"fixed": Behaviour(delay_s=0.2)})
    thread, ended = in_background(context_of(settings, run_id, profile, engines))
    until(lambda: row(database_url, run_id).progress_done > 0)
    with session_scope(database_url) as session:  # a recovery elsewhere took it for dead and re-queued it
        run = session.get(Run, run_id)
        assert run is not None
        queue.interrupt(session, run, "worker test-worker stopped during the run (no heartbeat for 91 s)")
    left = (row(database_url, run_id).__dict__.copy(), events(database_url, run_id), samples(database_url, run_id))
    thread.join(60)
    assert ended == ["interrupted"]
    after = (row(database_url, run_id).__dict__.copy(), events(database_url, run_id), samples(database_url, run_id))
    for state in (left, after):
        state[0].pop("_sa_instance_state")
    assert after == left and after[0]["status"] == "queued"
    assert engines.started[0]._server is None  # its engine stopped all the same


def test_owned_refuses_a_run_that_is_no_longer_this_workers(
    database_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile)
    changes: list[Callable[[Any, Run], None]] = [
        lambda session, run: queue.interrupt(session, run, "re-queued by a recovery"),
        lambda session, run: setattr(run, "worker_id", "another-worker"),
        lambda session, run: transition(session, run, Status.CANCELLED, "given up"),
        lambda session, run: session.execute(delete(Run).where(Run.id == run.id)),
    ]
    for change in changes:
        settings, run_id = claimed(database_url, tmp_path, profile)
        context = context_of(settings, run_id, profile, StandInEngines())
        with context.owned() as (_, run):
            run.progress_done = 1
        with session_scope(database_url) as session:
            taken = session.get(Run, run_id)
            assert taken is not None
            change(session, taken)
        with pytest.raises(RunLost, match=f"run {run_id} is no longer this worker's"):
            context.update(progress_done=2)


def test_a_recovery_waits_for_an_owned_write_and_the_next_write_is_refused(
    database_url: str, tmp_path: Path, make_profile: MakeProfile
) -> None:
    profile = gsm8k_profile(make_profile)
    settings, run_id = claimed(database_url, tmp_path, profile)
    context = context_of(settings, run_id, profile, StandInEngines())

    def recover() -> None:
        with session_scope(database_url) as session:
            run = session.scalar(select(Run).where(Run.id == run_id).with_for_update())
            assert run is not None
            queue.interrupt(session, run, "re-queued by a recovery")

    recovery = threading.Thread(target=recover)
    with context.owned() as (_, run):
        recovery.start()
        recovery.join(1.0)
        assert recovery.is_alive()  # the row (SQLite: the database) is this worker's until the write commits
        run.progress_done = 3
    recovery.join(30)
    assert (row(database_url, run_id).status, row(database_url, run_id).progress_done) == ("queued", 3)
    with pytest.raises(RunLost):
        context.update(progress_done=4)
