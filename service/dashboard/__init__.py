"""The release managers' dashboard: server-rendered pages, small scripts, no front-end server."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from service.dashboard import access, assets, profiles, releases, runs
from service.dashboard.render import STATIC_DIR


def install(app: FastAPI) -> None:
    """Add the pages, the login form, the static files and plotly.js to `app`."""
    app.include_router(access.router)
    app.include_router(runs.router)
    app.include_router(profiles.router)
    app.include_router(releases.router)
    app.include_router(assets.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_exception_handler(access.LoginRequired, access.login_redirect)
