"""The state machine and the durable queue on a real SQLite file."""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import select

from evals.records import Sample
from service.db.migrate import upgrade
from service.db.models import Run, RunEvent, utcnow
from service.db.session import session_scope
from service.runs import queue, store
from service.runs.context import RunContext, vllm_engines
from service.runs.state import ALLOWED, InvalidTransition, Status, transition
from service.runs.watch import Watcher
from service.settings import Settings
from tests.conftest import MakeProfile


@pytest.fixture
def db(database_url: str) -> str:
    return database_url


def _enqueue(url: str, n: int = 1, **kw: object) -> list[int]:
    ids = []
    with session_scope(url) as session:
        for _ in range(n):
            run, _ = queue.enqueue(
                session,
                profile="p",
                trigger="ci",
                triggered_by="t",
                labels={},
                overrides={},
                arms=[],
                max_attempts=kw.get("max_attempts", 3),  # type: ignore[arg-type]
            )
            session.flush()
            ids.append(run.id)
    return ids


def test_transitions_follow_the_machine(db: str) -> None:
    [run_id] = _enqueue(db)
    with session_scope(db) as session:
        run = session.get(Run, run_id)
        assert run is not None
        with pytest.raises(InvalidTransition):
            transition(session, run, Status.PASSED)
        for step in (Status.STARTING_ENGINE, Status.RUNNING, Status.SCORING, Status.PASSED):
            transition(session, run, step)
        assert run.attempt == 1 and run.finished_at is not None
        with pytest.raises(InvalidTransition):
            transition(session, run, Status.QUEUED)
        kinds = [e.kind for e in session.query(RunEvent).filter_by(run_id=run_id).order_by(RunEvent.id)]
    assert kinds == ["status:queued", "status:starting_engine", "status:running", "status:scoring", "status:passed"]
    assert all(not ALLOWED[s] for s in (Status.PASSED, Status.FAILED, Status.ERROR, Status.CANCELLED))


def _claim_many(url: str, worker: str, out: multiprocessing.Queue[list[int]]) -> None:
    claimed = []
    while True:
        with session_scope(url) as session:
            run = queue.claim_next(session, worker)
            if run is None:
                break
            claimed.append(run.id)
    out.put(claimed)


@pytest.mark.slow
def test_four_processes_claim_each_run_exactly_once(db: str) -> None:
    ids = _enqueue(db, 40)
    spawn = multiprocessing.get_context("spawn")  # fresh processes, as separate services would be
    out: multiprocessing.Queue[list[int]] = spawn.Queue()
    workers = [spawn.Process(target=_claim_many, args=(db, f"w{i}", out)) for i in range(4)]
    for w in workers:
        w.start()
    claimed = [out.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(10)
    flat = [run_id for batch in claimed for run_id in batch]
    assert sorted(flat) == ids


def test_recover_requeues_runs_of_a_dead_worker_until_attempts_run_out(db: str) -> None:
    [run_id] = _enqueue(db, max_attempts=2)
    for attempt in (1, 2):
        with session_scope(db) as session:
            run = queue.claim_next(session, "somehost:999999999:dead")
            assert run is not None and run.id == run_id and run.attempt == attempt
        with session_scope(db) as session:
            assert queue.recover(session, host="somehost", stale_after_s=3600) == [run_id]
    with session_scope(db) as session:
        run = session.get(Run, run_id)
        assert run is not None
        assert run.status == Status.ERROR.value and "interrupted 2 times" in run.error
        notes = session.scalars(select(RunEvent.message).where(RunEvent.kind == "status:interrupted")).all()
        assert notes and all("(its process 999999999 is gone)" in note for note in notes), notes


def test_recover_names_the_silence_of_a_worker_on_another_host(db: str) -> None:
    [run_id] = _enqueue(db)
    with session_scope(db) as session:
        run = queue.claim_next(session, "elsewhere:1:x")
        assert run is not None
        run.heartbeat_at = utcnow() - timedelta(seconds=120)
    with session_scope(db) as session:
        assert queue.recover(session, host="here", stale_after_s=200) == []
        assert queue.recover(session, host="here", stale_after_s=90) == [run_id]
        note = session.scalars(select(RunEvent.message).where(RunEvent.kind == "status:interrupted")).one()
        assert note.startswith("worker elsewhere:1:x stopped during the run (no heartbeat for 12"), note


def test_the_heartbeat_outlives_a_database_it_could_not_reach_for_a_while(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, make_profile: MakeProfile
) -> None:
    """SQLite's own error for a folder that is not there yet stands in for a database that is down."""
    ready = tmp_path / "ready"
    ready.mkdir()
    upgrade(f"sqlite:///{ready / 'kv.db'}")
    [run_id] = _enqueue(f"sqlite:///{ready / 'kv.db'}")
    with session_scope(f"sqlite:///{ready / 'kv.db'}") as session:
        queue.claim_next(session, "test-worker", run_id)
    later = tmp_path / "later"
    url = f"sqlite:///{later / 'kv.db'}"
    settings = Settings(database_url=url, data_dir=tmp_path / "data")
    context = RunContext(
        run_id, settings, make_profile("m"), "test-worker", partial(session_scope, url), vllm_engines(settings), []
    )
    watcher = Watcher(context)
    with caplog.at_level(logging.ERROR, logger="service.runs.watch"):
        watcher.start()
        try:
            _until(lambda: "heartbeat failed" in caplog.text)
            ready.rename(later)

            def beaten() -> bool:
                with session_scope(url) as session:
                    run = session.get(Run, run_id)
                    return run is not None and run.heartbeat_at is not None

            _until(beaten)
        finally:
            watcher.done.set()


def _until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_recover_leaves_live_workers_alone(db: str) -> None:
    import os
    import socket

    [run_id] = _enqueue(db)
    with session_scope(db) as session:
        assert queue.claim_next(session, f"{socket.gethostname()}:{os.getpid()}:x") is not None
    with session_scope(db) as session:
        assert queue.recover(session, host=socket.gethostname(), stale_after_s=3600) == []
        run = session.get(Run, run_id)
        assert run is not None and run.status == Status.STARTING_ENGINE.value


def test_drop_samples_deletes_only_the_named_items_of_one_arm_and_suite(db: str) -> None:
    """What a resumed attempt drops: an earlier attempt's items it no longer has."""
    [run_id] = _enqueue(db)
    rows = [
        Sample(key=f"q{i}", prompt_hash=f"h{i}", target="1", response="1", correct={"strict-match": True})
        for i in range(4)
    ]
    with session_scope(db) as session:
        for arm in ("stock", "fixed"):
            store.save_samples(session, run_id, arm, "gsm8k", "strict-match", rows)
        store.drop_samples(session, run_id, "fixed", "gsm8k", {"q1", "q3"})
        store.drop_samples(session, run_id, "fixed", "gsm8k", set())
    with session_scope(db) as session:
        assert sorted(store.load_samples(session, run_id, "fixed", "gsm8k")) == ["q0", "q2"]
        assert sorted(store.load_samples(session, run_id, "stock", "gsm8k")) == ["q0", "q1", "q2", "q3"]
