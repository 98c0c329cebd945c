"""App factory: migrations, profiles, baselines, routers, and the local worker, in that order."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import baselines, dashboard
from service.alerting.watcher import AlertWatcher
from service.api import catalog, compare, ops, runs, schedules
from service.db.migrate import upgrade
from service.db.session import session_scope
from service.profile_catalog import configured_profiles
from service.runs.worker import LocalWorker
from service.scheduling.loop import Scheduler
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, whether or not they declare a length."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge()
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse({"detail": f"request body over {self.limit} bytes"}, status_code=413)
        await response(scope, receive, send)


class _TooLarge(Exception):
    pass


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.resolved_database_url()
        settings.data_dir.mkdir(parents=True, exist_ok=True)
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
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.include_router(runs.router)
    app.include_router(catalog.router)
    app.include_router(ops.router)
    app.include_router(compare.router)
    dashboard.install(app)
    app.include_router(schedules.router)

    @app.middleware("http")
    async def no_cache_api(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        if request.url.path.startswith("/api/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    return app
