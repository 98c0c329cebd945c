"""The executor thread in `kvcanary serve`: runs queued runs here, one at a time, or hands
them to a Ray cluster (`executor: ray`, service/runs/ray_executor.py).

Several service processes may share a database: each claims runs atomically, and each
re-queues runs whose worker died (its pid gone on this host, or its heartbeat stale).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from service.db.session import session_scope
from service.profiles import Profile
from service.runs import pipeline, queue
from service.runs.orphan_guard import OrphanGuard
from service.runs.ray_executor import RayDispatcher
from service.settings import Settings

log = logging.getLogger(__name__)

STALE_AFTER_S = 90.0  # heartbeats come every second; a loaded host can starve one for a while


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def recover_dead_runs(settings: Settings) -> list[int]:
    with session_scope(settings.resolved_database_url()) as session:
        return queue.recover(session, host=socket.gethostname(), stale_after_s=STALE_AFTER_S)


def run_next(settings: Settings, profiles: dict[str, Profile], worker_id: str) -> int | None:
    """Claim and execute one queued run; the id it ran, or None if the queue was empty."""
    with session_scope(settings.resolved_database_url()) as session:
        run = queue.claim_next(session, worker_id)
        run_id = run.id if run else None
    if run_id is None:
        return None
    log.info("worker %s runs run %d", worker_id, run_id)
    with OrphanGuard():  # if this process is killed, its engine must not outlive it
        pipeline.run_claimed(run_id, settings, profiles, worker_id)
    return run_id


class LocalWorker:
    def __init__(self, settings: Settings, profiles: dict[str, Profile]) -> None:
        self.settings = settings
        self.profiles = profiles
        self.worker_id = new_worker_id()
        self._stop = threading.Event()
        self._ray: RayDispatcher | None = None
        if settings.executor == "ray":
            self._ray = RayDispatcher(settings, profiles, self.worker_id)
        self._thread = threading.Thread(target=self._loop, name="kvcanary-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                recovered = recover_dead_runs(self.settings)
                if recovered:
                    log.warning("re-queued runs left by a dead worker: %s", recovered)
                if self._ray is not None:
                    self._ray.step()
                elif run_next(self.settings, self.profiles, self.worker_id) is not None:
                    continue
            except Exception:
                log.exception("worker loop error; retrying")
            self._stop.wait(self.settings.worker_poll_s)
        if self._ray is not None:
            self._ray.shutdown()
