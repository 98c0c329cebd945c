"""App factory: migrations, profiles, baselines, routers, and the local worker, in that order."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import access_log, baselines, dashboard, engine_bounds
from service.alerting.watcher import AlertWatcher
from service.api import catalog, compare, docs, errors, mutants, ops, quotas, releases, runs, schedules, tokens
from service.api.gate import Admission, InTurn, Load, RequestGate
from service.api.headers import SecurityHeaders
from service.db.migrate import upgrade
from service.db.session import session_scope
from service.profile_catalog import configured_profiles
from service.runs.worker import LocalWorker
from service.scheduling.loop import Scheduler
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)


class NoStoreApi:
    """`Cache-Control: no-store` on API answers. Plain ASGI: Starlette's `BaseHTTPMiddleware` costs
    a task and two streams per request, which a burst of 1,000 requests pays before any is served."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return

        async def no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).setdefault("Cache-Control", "no-store")
            await send(message)

        await self.app(scope, receive, no_store)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.resolved_database_url()
        # Fewer threads than anyio's 40: request threads spend their time in Python (the ORM)
        # holding the GIL, and 40 of them starve the event loop that answers /healthz.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.request_threads
        access_log.install()
        settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        settings.runs_dir().mkdir(mode=0o700, exist_ok=True)
        upgrade(url)
        profiles = configured_profiles(settings)
        engine_bounds.read_bounds(profiles.values())  # vLLM's lists and each model's context, before the first trigger
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
        docs_url=None,  # service.api.docs serves both from installed files, under the pages' CSP
        redoc_url=None,
    )
    app.state.settings = settings
    # Outermost last: the gate reads the body (within its deadline) before anything else runs,
    # admission counts a request in flight only once its body is in, so a client that never
    # finishes its body holds no place, and a request waits for its turn after that.
    errors.install(app)
    app.state.load = load = Load(settings.max_in_flight)
    app.add_middleware(InTurn, limit=settings.request_threads)
    app.add_middleware(Admission, load=load)
    app.add_middleware(RequestGate, limit=settings.max_body_bytes, deadline_s=settings.body_timeout_s)
    app.add_middleware(SecurityHeaders)
    routers = (runs, catalog, compare, schedules, tokens, releases, mutants, quotas)
    for module in routers:
        app.include_router(module.router, responses=errors.API_ERRORS)
    app.include_router(ops.router)
    docs.install(app)
    dashboard.install(app)

    app.add_middleware(NoStoreApi)
    return app
