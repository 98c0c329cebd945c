"""App factory: migrations, profiles, baselines, routers, and the local worker, in that order."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI, Request, Response

from service import baselines, dashboard
from service.alerting.watcher import AlertWatcher
from service.api import catalog, compare, errors, mutants, ops, runs, schedules, tokens
from service.api.gate import Admission, RequestGate
from service.db.migrate import upgrade
from service.db.session import session_scope
from service.profile_catalog import configured_profiles
from service.runs.worker import LocalWorker
from service.scheduling.loop import Scheduler
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.resolved_database_url()
        # Fewer threads than anyio's 40: request threads spend their time in Python (the ORM)
        # holding the GIL, and 40 of them starve the event loop that answers /healthz.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.request_threads
        settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        settings.runs_dir().mkdir(mode=0o700, exist_ok=True)
        upgrade(url)
        profiles = configured_profiles(settings)
        with session_scope(url) as session:
            baselines.seed_from_profiles(session, profiles)
        app.state.settings = settings
        app.state.profiles = profiles
        worker = LocalWorker(settings, profiles) if settings.start_worker else None
        if worker:
            worker.start()
        scheduler, alerts = Scheduler(settings, profiles), AlertWatcher(settings)
        scheduler.start()
        alerts.start()
        yield
        scheduler.stop()
        alerts.stop()
        if worker:
            worker.stop()

    app = FastAPI(
        title="kvcanary",
        version="0.1.0",
        summary="End-to-end accuracy gate for vLLM attention kernels",
        lifespan=lifespan,
    )
    app.state.settings = settings
    # Outermost last: admission answers before a body is read, the gate before any route runs.
    errors.install(app)
    app.add_middleware(RequestGate, limit=settings.max_body_bytes)
    app.add_middleware(Admission, limit=settings.max_in_flight)
    for router in (runs.router, catalog.router, compare.router, schedules.router, tokens.router, mutants.router):
        app.include_router(router, responses=errors.API_ERRORS)
    app.include_router(ops.router)
    dashboard.install(app)

    @app.middleware("http")
    async def no_cache_api(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        if request.url.path.startswith("/api/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    return app
