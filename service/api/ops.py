"""Liveness and Prometheus metrics."""

from __future__ import annotations

import time

import anyio
import anyio.to_thread
from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest
from sqlalchemy import func, select, text

from service.api.deps import SessionDep, SettingsDep
from service.db.models import Run
from service.db.session import session_scope
from service.runs.state import Status

router = APIRouter(tags=["ops"])

DURATION_BUCKETS = (60, 300, 600, 1800, 3600, 7200, 14400, 28800)


HEALTH_FRESH_S = 1.0


class DatabaseProbe:
    """Whether the database answered `SELECT 1` within the last second.

    A health check asks at most once a second, in a thread of its own; the checks in between
    answer from the event loop. A burst that fills the request threads (whose ORM work holds
    the GIL) then cannot make the service look dead to its load balancer or orchestrator.
    """

    def __init__(self) -> None:
        self._threads = anyio.CapacityLimiter(1)
        self._answered_at = -HEALTH_FRESH_S

    async def check(self, url: str) -> None:
        if time.monotonic() - self._answered_at < HEALTH_FRESH_S:
            return
        await anyio.to_thread.run_sync(self._select_one, url, limiter=self._threads)
        self._answered_at = time.monotonic()

    @staticmethod
    def _select_one(url: str) -> None:
        with session_scope(url, write=False) as session:
            session.execute(text("SELECT 1"))


_database = DatabaseProbe()


@router.get("/healthz")
async def healthz(settings: SettingsDep) -> dict[str, str]:
    await _database.check(settings.resolved_database_url())
    return {"status": "ok"}


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(session: SessionDep) -> Response:
    """Runs by status, queue length, and finished-run durations, read from the database.

    Built per scrape from the database so every replica reports the same truth.
    """
    registry = CollectorRegistry()
    by_status = Gauge("kvcanary_runs", "Runs by status", ["status"], registry=registry)
    counts = dict(session.execute(select(Run.status, func.count()).group_by(Run.status)).all())
    for state in Status:
        by_status.labels(state.value).set(counts.get(state.value, 0))
    Gauge("kvcanary_queue_length", "Runs waiting to start", registry=registry).set(counts.get(Status.QUEUED.value, 0))
    durations = Histogram(
        "kvcanary_run_duration_seconds",
        "Wall time of finished runs",
        ["profile"],
        buckets=DURATION_BUCKETS,
        registry=registry,
    )
    finished = session.execute(
        select(Run.profile, Run.started_at, Run.finished_at).where(
            Run.finished_at.is_not(None), Run.started_at.is_not(None)
        )
    )
    for profile, started, ended in finished:
        if started is not None and ended is not None:
            durations.labels(profile).observe((ended - started).total_seconds())
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
