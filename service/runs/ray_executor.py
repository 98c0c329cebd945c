"""The Ray executor: every claimed run becomes one Ray task on the node Ray picks.

A service replica with `executor: ray` claims runs from the shared database as the local
worker does, but one replica at a time and only once the run handed over before has started
(so runs start in queue order), then hands each to the Ray cluster as a task that asks for the run's
resources: `num_gpus = tensor_parallel_size` for a profile with `engine.needs_gpu` (the rule
the local executor refuses by, `service.engine.gpus.gpus_needed`), else one CPU. The task runs
the same pipeline (`pipeline.run_claimed`) as the local worker, so the engine, the suites, progress and
results reach the shared database as they would on one host.

The replica that claimed a run stays its owner (`runs.worker_id`). Ray ties a task to the
driver that submitted it: if the replica dies, its tasks die with it, the orphan guard kills
their engines, and the queue's recovery re-queues the runs. Outcomes the pipeline cannot
record itself are settled here: a node or worker lost mid-run ends the run `interrupted` and
re-queues it; a cancel the pipeline has not finished within a grace period kills the task,
whose engine the orphan guard then kills, and ends the run `cancelled`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select, text
from sqlalchemy.orm import Session

from service.db.models import Run, RunEvent, utcnow
from service.db.session import session_scope
from service.engine.gpus import gpus_needed
from service.private_files import keep_private
from service.profiles import Profile
from service.runs import pipeline, queue
from service.runs.admission import RunRefused, stored_profile
from service.runs.context import locked_run, owns
from service.runs.orphan_guard import OrphanGuard
from service.runs.state import ACTIVE, Status, transition
from service.settings import Settings

log = logging.getLogger(__name__)

DISPATCHED_EVENT = "ray_dispatched"
STARTED_EVENT = "ray_started"
WAITING_EVENT = "ray_waiting"
RAY_EVENTS = (DISPATCHED_EVENT, WAITING_EVENT, STARTED_EVENT)
# Any number, the same in every replica: the PostgreSQL advisory lock that orders claims.
CLAIM_LOCK_KEY = 0x6B76636E
# Beyond the engine's own stop grace: time the pipeline gets to end a cancelled run itself.
CANCEL_GRACE_S = 15.0
RAY_NAMESPACE = "kvcanary"
CONNECT_ATTEMPTS = 3
CONNECT_RETRY_S = 2.0


def task_resources(profile: Profile | None) -> dict[str, float]:
    """What the run's task asks Ray for: one CPU, and the GPUs its profile needs (`gpus_needed`)."""
    return {"num_cpus": 1, "num_gpus": gpus_needed(profile) if profile is not None else 0}


def sizing_profile(run: Run, profiles: Mapping[str, Profile]) -> Profile | None:
    """The profile the run executes (its snapshot, not the file as it is now), which sizes its
    task; None when it cannot be read: the task then refuses the run and says why."""
    try:
        return stored_profile(run, profiles)
    except RunRefused:
        return None


def unplaceable(resources: dict[str, float], nodes: list[dict[str, Any]]) -> str | None:
    """Why no live node could run a task asking for `resources` now; None if one could.

    A run's engine lives on one node, so the GPUs must be on one node, not summed.
    """
    alive = [node.get("Resources", {}) for node in nodes if node.get("Alive")]
    gpus, cpus = resources["num_gpus"], resources["num_cpus"]
    if any(r.get("GPU", 0) >= gpus and r.get("CPU", 0) >= cpus for r in alive):
        return None
    most = max((r.get("GPU", 0.0) for r in alive), default=0.0)
    return (
        f"no node of the Ray cluster has {gpus:g} GPU(s) and {cpus:g} CPU(s) (largest: {most:g} GPU(s) "
        f"on {len(alive)} live node(s)); the run waits until such a node joins. Cancel it to give up, "
        "or lower engine.tensor_parallel_size in its profile"
    )


def latest_ray_events(session: Session, run_ids: Sequence[int] | Select[int]) -> dict[int, str]:
    """Each run's newest Ray event kind: a re-queued run's earlier attempts do not count."""
    ray_events = RunEvent.run_id.in_(run_ids), RunEvent.kind.in_(RAY_EVENTS)
    newest = select(func.max(RunEvent.id)).where(*ray_events).group_by(RunEvent.run_id)
    rows = session.execute(select(RunEvent.run_id, RunEvent.kind).where(RunEvent.id.in_(newest)))
    return {run_id: kind for run_id, kind in rows}


def dispatch_pending(session: Session) -> bool:
    """Whether a run handed to Ray waits for a node that could take it (no replica claims then)."""
    starting = select(Run.id).where(Run.status == Status.STARTING_ENGINE.value)
    return DISPATCHED_EVENT in latest_ray_events(session, starting).values()


def placement_change(
    latest: str | None, resources: dict[str, float], nodes: list[dict[str, Any]]
) -> tuple[str, str] | None:
    """The event (kind, message) a not-yet-started run needs when the cluster changed under it;
    None when nothing changed.

    A handed-over run that no live node can take any more (its node died) waits, and holds
    back only its own replica; a waiting one that a node can now take is handed over again.
    """
    why = unplaceable(resources, nodes)
    if latest == DISPATCHED_EVENT and why:
        return WAITING_EVENT, why
    if latest == WAITING_EVENT and not why:
        return DISPATCHED_EVENT, f"a node that can take it is up; {_asked(resources)}"
    return None


def _asked(resources: dict[str, float]) -> str:
    return f"handed to Ray, asking for {resources['num_gpus']:g} GPU(s) and {resources['num_cpus']:g} CPU(s)"


def _next_queued(session: Session) -> Run | None:
    """The queued run that starts next, callers in turn (`service.runs.queue.in_turn`)."""
    return session.scalar(select(Run).where(Run.status == Status.QUEUED.value).order_by(*queue.in_turn()).limit(1))


def serialize_claims(session: Session) -> None:
    """Replicas decide and claim one at a time, until this transaction ends.

    On SQLite, opening the write transaction takes its single write lock; PostgreSQL takes a
    transaction-scoped advisory lock.
    """
    session.connection()  # begins the transaction now, not at the first statement
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": CLAIM_LOCK_KEY})


def _take_over(url: str, run_id: int, owner: str) -> bool:
    """Start only a run still claimed by `owner` and not yet begun, so no run executes twice."""
    import ray

    with session_scope(url) as session:
        run = locked_run(session, run_id)
        if run is None or run.worker_id != owner or run.status != Status.STARTING_ENGINE.value:
            return False
        run.heartbeat_at = utcnow()
        node = ray.get_runtime_context().get_node_id()
        where = f"node {node} ({socket.gethostname()}, {ray.util.get_node_ip_address()}), pid {os.getpid()}"
        session.add(RunEvent(run_id=run_id, kind=STARTED_EVENT, message=f"Ray task started on {where}"))
    return True


def node_settings(database_url: str) -> Settings:
    """This node's own KVCANARY_* environment (where `ray start` ran) with the shared database.

    Paths are the node's business: its data folder and the Python that has vLLM (by default
    the one running this task). A relative data folder is made absolute, since Ray starts
    workers in a folder of its own.
    """
    settings = Settings()
    return settings.model_copy(update={"database_url": database_url, "data_dir": settings.data_dir.resolve()})


def run_on_node(run_id: int, owner: str, database_url: str, profiles: dict[str, Profile]) -> str:
    """The Ray task: take the run over from the replica that claimed it, execute it on this node."""
    keep_private()  # the node's run folder, like the service's, is the service user's alone
    if not _take_over(database_url, run_id, owner):
        return "skipped"
    with OrphanGuard():
        return pipeline.run_claimed(run_id, node_settings(database_url), profiles, owner)


@dataclass
class _InFlight:
    run_id: int
    ref: Any  # ray.ObjectRef of run_on_node
    cancel_grace_s: float
    resources: dict[str, float]
    started: bool = False
    cancel_seen_at: float | None = None
    killed: bool = False


class RayDispatcher:
    """Claims runs for one service replica and follows their Ray tasks; `step()` once per poll."""

    def __init__(self, settings: Settings, profiles: dict[str, Profile], worker_id: str) -> None:
        if not settings.ray_address:
            raise ValueError(
                "KVCANARY_EXECUTOR=ray needs KVCANARY_RAY_ADDRESS: the Ray cluster's address, e.g. "
                "ray://head-node:10001 (Ray Client) or head-node:6379 / auto on a node of the cluster"
            )
        import ray

        self._ray = ray
        # ray.init installs a SIGTERM handler that exits at once; keep the service's own, which
        # stops this dispatcher first (see shutdown).
        own_handler = signal.getsignal(signal.SIGTERM)
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                ray.init(address=settings.ray_address, namespace=RAY_NAMESPACE, log_to_driver=False)
                break
            except (ConnectionError, RuntimeError) as exc:
                # Ray Client's head starts a server process per connection, and that start
                # sometimes fails ("Starting Ray client server failed"); a new connection works.
                if attempt == CONNECT_ATTEMPTS:
                    raise RuntimeError(
                        f"cannot reach the Ray cluster at KVCANARY_RAY_ADDRESS={settings.ray_address!r} "
                        f"after {attempt} attempts: {exc}; start it (`ray start --head`) or fix the address"
                    ) from exc
                log.warning("connecting to Ray failed (attempt %d of %d): %s", attempt, CONNECT_ATTEMPTS, exc)
                time.sleep(CONNECT_RETRY_S)
        if own_handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, own_handler)
        self._task = ray.remote(run_on_node)
        self.url = settings.resolved_database_url()
        self.profiles = profiles
        self.worker_id = worker_id
        self.in_flight: dict[int, _InFlight] = {}

    def step(self) -> None:
        """Settle finished tasks, keep pending runs alive and honour cancels, then claim one more."""
        if self.in_flight:
            refs = [flight.ref for flight in self.in_flight.values()]
            done = set(self._ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            for flight in [f for f in self.in_flight.values() if f.ref in done]:
                self._settle(flight)
        self._follow()
        if all(f.started for f in self.in_flight.values()):
            self._claim()

    def shutdown(self) -> None:
        """Stop this replica's tasks (Ray would on disconnect) and re-queue their runs at once."""
        for flight in list(self.in_flight.values()):
            self._ray.cancel(flight.ref, force=True)
        for flight in list(self.in_flight.values()):
            self._settle(flight, lost_reason="the service replica that dispatched it stopped")
        self._ray.shutdown()

    @staticmethod
    def _room_for(need: dict[str, float], free: dict[str, float], nodes: list[dict[str, Any]]) -> bool:
        """Whether the cluster has room for a task asking for `need` now, or never will.

        Runs wait in the database queue, in order, not inside Ray: Ray hands a finished
        task's worker to the same replica's next waiting task, so a task waiting there can be
        overtaken by every later run of another replica. A run no node could ever take is
        claimed anyway, so that its events can say why it waits.
        """
        if free.get("CPU", 0.0) >= need["num_cpus"] and free.get("GPU", 0.0) >= need["num_gpus"]:
            return True
        return unplaceable(need, nodes) is not None

    def _claim(self) -> None:
        """Claim the next queued run in turn when no handed-over run still waits for its node.

        Ray reports free resources late, so two replicas (or one, twice) could both see room
        for one run; deciding under one lock, and only once the last run handed over has
        started, keeps the start order the queue order. Ray is asked before the lock is taken,
        so a slow Ray never holds the database. A replica killed between its claim and the
        hand-over holds the others back until the queue's recovery re-queues that run.
        """
        with session_scope(self.url, write=False) as session:
            if _next_queued(session) is None or dispatch_pending(session):
                return
        free, nodes = self._ray.available_resources(), self._ray.nodes()
        with session_scope(self.url) as session:
            serialize_claims(session)
            following = _next_queued(session)
            if following is None or dispatch_pending(session):
                return
            profile = sizing_profile(following, self.profiles)
            resources = task_resources(profile)
            if not self._room_for(resources, free, nodes):
                return
            run = queue.claim_next(session, self.worker_id, following.id)  # the run just sized, not a later one
            if run is None:
                return
            run_id = run.id
            waiting = unplaceable(resources, nodes)
            kind = WAITING_EVENT if waiting else DISPATCHED_EVENT
            session.add(RunEvent(run_id=run_id, kind=kind, message=waiting or _asked(resources)))
        given = {run.profile: self.profiles[run.profile]} if run.profile in self.profiles else {}
        task = self._task.options(name=f"kvcanary-run-{run_id}", max_retries=0, retry_exceptions=False, **resources)
        try:
            ref = task.remote(run_id, self.worker_id, self.url, given)
        except Exception as exc:  # whatever Ray raises, the claimed run must not be left behind
            log.exception("handing run %d to Ray failed", run_id)
            self._hand_back(run_id, f"handing it to Ray failed ({type(exc).__name__}: {exc})")
            return
        grace = (profile.engine.stop_grace_s if profile else 0.0) + CANCEL_GRACE_S
        self.in_flight[run_id] = _InFlight(run_id, ref, grace, resources)
        log.info("run %d handed to Ray as %s with %s", run_id, ref, resources)

    def _hand_back(self, run_id: int, why: str) -> None:
        """Re-queue a claimed run at once rather than leave it for the stale-heartbeat recovery."""
        with session_scope(self.url) as session:
            run = self._owned_active(session, run_id)
            if run is not None:
                queue.interrupt(session, run, why)

    def _owned_active(self, session: Session, run_id: int) -> Run | None:
        """The run, locked, while this replica still owns it and it has not ended."""
        run = locked_run(session, run_id)
        return run if owns(run, self.worker_id) else None

    def _follow(self) -> None:
        """Heartbeat runs whose task waits for a node; cancel tasks whose run was cancelled."""
        if not self.in_flight:
            return
        ids = list(self.in_flight)
        nodes = self._ray.nodes() if not all(f.started for f in self.in_flight.values()) else []
        with session_scope(self.url) as session:
            latest = latest_ray_events(session, ids)
            for run in session.scalars(select(Run).where(Run.id.in_(ids))):
                flight = self.in_flight[run.id]
                flight.started = flight.started or latest.get(run.id) == STARTED_EVENT
                status = Status(run.status)
                if status == Status.QUEUED or (status in ACTIVE and run.worker_id != self.worker_id):
                    # Re-queued by a replica's recovery: this task must not run it as well.
                    self._kill(flight, "its run was taken over elsewhere")
                if status not in ACTIVE or run.worker_id != self.worker_id:
                    continue
                if not flight.started:
                    run.heartbeat_at = utcnow()
                    change = placement_change(latest.get(run.id), flight.resources, nodes)
                    if change is not None and status == Status.STARTING_ENGINE:
                        session.add(RunEvent(run_id=run.id, kind=change[0], message=change[1]))
                if run.cancel_requested:
                    self._cancel(flight)

    def _cancel(self, flight: _InFlight) -> None:
        """A task not started yet is dropped at once; a started one gets time to stop cleanly."""
        now = time.monotonic()
        if flight.cancel_seen_at is None:
            flight.cancel_seen_at = now
        if not flight.started or now - flight.cancel_seen_at > flight.cancel_grace_s:
            self._kill(flight, "its run was cancelled")

    def _kill(self, flight: _InFlight, why: str) -> None:
        if not flight.killed:
            log.warning("cancelling the Ray task of run %d: %s", flight.run_id, why)
            self._ray.cancel(flight.ref, force=True)
            flight.killed = True

    def _settle(self, flight: _InFlight, lost_reason: str | None = None) -> None:
        """Record what the pipeline could not: a lost node, a killed task, a task that crashed."""
        del self.in_flight[flight.run_id]
        reason = lost_reason
        failure = ""
        if reason is None:
            try:
                self._ray.get(flight.ref, timeout=0)
            except self._ray.exceptions.TaskCancelledError:
                pass
            except self._ray.exceptions.RayTaskError as exc:
                failure = f"the run's Ray task raised {type(exc.cause).__name__}: {exc.cause}"
            except self._ray.exceptions.RayError as exc:
                reason = f"{type(exc).__name__}: {exc}"
        with session_scope(self.url) as session:
            run = self._owned_active(session, flight.run_id)
            if run is None:
                return  # the pipeline recorded the end itself, or another replica took the run over
            if reason is not None:
                queue.interrupt(session, run, f"Ray lost the run's task ({reason})")
            elif failure:
                run.error = failure
                transition(session, run, Status.ERROR, failure)
            elif run.cancel_requested and run.status != Status.SCORING.value:
                transition(session, run, Status.CANCELLED, "cancelled; its Ray task and engine were stopped")
            else:
                run.error = "the run's Ray task ended without recording an outcome"
                transition(session, run, Status.ERROR, run.error)
        log.info("run %d settled after its Ray task ended", flight.run_id)
