"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily
from sqlalchemy import case, func, select, text
from sqlalchemy.orm import Session

from service.api.deps import SessionDep, SettingsDep, require
from service.api.errors import documented
from service.api.gate import Load
from service.db.models import Run
from service.db.session import session_scope
from service.roles import Role
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
    """Liveness: the process answers and its database did within the last second."""
    await _database.check(settings.resolved_database_url())
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "The API refuses new work now; send traffic elsewhere"}})
async def readyz(request: Request, settings: SettingsDep) -> JSONResponse:
    """Readiness for a load balancer: 503 while API requests are being refused (as many in
    flight as `KVCANARY_MAX_IN_FLIGHT` allows), 200 otherwise; both say how full it is."""
    await _database.check(settings.resolved_database_url())
    load: Load = request.app.state.load
    body = {"status": "busy" if load.full else "ready", "in_flight": load.in_flight, "limit": load.limit}
    return JSONResponse(
        body, status_code=503 if load.full else 200, headers={"Retry-After": "2"} if load.full else None
    )


class _Durations:
    """`kvcanary_run_duration_seconds` from per-profile bucket counts the database computed."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "kvcanary_run_duration_seconds", "Wall time of finished runs", labels=["profile"]
        )
        for row in self.rows:
            profile, count, total, within = row[0], row[1], row[2], row[3:]
            buckets = [(str(float(edge)), n or 0) for edge, n in zip(DURATION_BUCKETS, within, strict=True)]
            family.add_metric([profile], [*buckets, ("+Inf", count)], sum_value=total or 0.0)
        yield family


def duration_rows(session: Session) -> list[tuple[Any, ...]]:
    """Per profile: finished runs, their summed seconds, and how many fit each bucket.

    One aggregate over the (profile, duration_s) index, answered with a row per profile: a
    scrape never moves every finished run into Python, nor parses any run's timestamps.
    """
    seconds = Run.duration_s
    within = [func.sum(case((seconds <= edge, 1), else_=0)) for edge in DURATION_BUCKETS]
    query = (
        select(Run.profile, func.count(), func.sum(seconds), *within).where(seconds.is_not(None)).group_by(Run.profile)
    )
    return [tuple(row) for row in session.execute(query).all()]


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, **documented(401, 503)},
    dependencies=[Depends(require(Role.VIEWER))],
)
def metrics(session: SessionDep) -> Response:
    """Runs by status, queue length, and finished-run durations, read from the database.

    Built per scrape from the database so every replica reports the same truth; behind a
    viewer token when reads need one (`KVCANARY_READ_AUTH`): give Prometheus a bearer token.
    """
    registry = CollectorRegistry()
    by_status = Gauge("kvcanary_runs", "Runs by status", ["status"], registry=registry)
    counts = dict(session.execute(select(Run.status, func.count()).group_by(Run.status)).all())
    for state in Status:
        by_status.labels(state.value).set(counts.get(state.value, 0))
    Gauge("kvcanary_queue_length", "Runs waiting to start", registry=registry).set(counts.get(Status.QUEUED.value, 0))
    registry.register(_Durations(duration_rows(session)))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
