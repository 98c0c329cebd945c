"""Who reads the dashboard: the same token rules as the API, with a login form instead of a 401.

The login form checks the token and starts a server-side session (service.dashboard_sessions):
the `kvcanary_session` cookie holds the session's random id, never the token, and `require()`
reads it when no bearer header is sent, so the pages and the JSON API their scripts call agree
on who the reader is. Logout deletes the session, so a copied cookie stops working too. The
cookie is HttpOnly and SameSite=Strict: scripts cannot read it, and another site cannot make a
browser send it along with a promote or baseline edit. Changes made with the cookie also carry
a CSRF token (see `service.api.deps.csrf_token`) that every page puts in its `csrf-token` meta
tag, so a browser or proxy that ignores SameSite is still covered.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qs, quote

import anyio.to_thread
from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service import dashboard_sessions
from service.api.deps import ANONYMOUS, COOKIE, Caller, SettingsDep, Writer, WriterDep, session_caller
from service.auth import Role, lookup
from service.dashboard.render import page

MAX_FORM_BYTES = 4096

router = APIRouter(include_in_schema=False)


class LoginRequired(Exception):
    """Raised by page dependencies; the handler sends the browser to the login form."""

    def __init__(self, next_url: str, reason: str) -> None:
        super().__init__(reason)
        self.next_url = next_url
        self.reason = reason


def page_caller(request: Request, settings: SettingsDep) -> Caller:
    """The reader of a page: the API's viewer check, on the login cookie only."""
    try:
        return session_caller(request.cookies.get(COOKIE), settings, Role.VIEWER)
    except HTTPException as exc:
        if exc.status_code == status.HTTP_401_UNAUTHORIZED:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            raise LoginRequired(target, str(exc.detail)) from exc
        raise


PageCaller = Annotated[Caller, Depends(page_caller)]


def login_redirect(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LoginRequired)
    response = RedirectResponse(f"/login?next={quote(exc.next_url)}", status.HTTP_303_SEE_OTHER)
    if COOKIE in request.cookies:
        response.delete_cookie(COOKIE)  # the session has ended; ask for a token again
    return response


def safe_next(target: str | None) -> str:
    """Only a path on this site: never `//host` or a full URL someone slipped into the link."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/runs"
    return target


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next_url: Annotated[str | None, Query(alias="next")] = None) -> HTMLResponse:
    return page(request, "login.html", ANONYMOUS, next=safe_next(next_url), error="")


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, writer: WriterDep) -> Response:
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"login form over {MAX_FORM_BYTES} bytes")
    form = parse_qs(body.decode("utf-8", errors="replace"))
    token = (form.get("token") or [""])[0].strip()
    target = safe_next((form.get("next") or [""])[0])
    started = await anyio.to_thread.run_sync(_start_session, writer, token) if token else None
    if started is None:
        error = "That token is unknown or revoked. Ask an admin for one (`kvcanary tokens create --role viewer`)."
        return page(request, "login.html", ANONYMOUS, status.HTTP_401_UNAUTHORIZED, next=target, error=error)
    secret, lifetime_s = started
    response = RedirectResponse(target, status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        COOKIE,
        secret,
        max_age=lifetime_s,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


def _start_session(writer: Writer, token: str) -> tuple[str, int] | None:
    """A session for a live token (its cookie value and lifetime), or None for a dead one."""
    with writer() as session:
        row = lookup(session, token)
        return dashboard_sessions.start(session, row) if row is not None else None


@router.post("/logout")
def logout(request: Request, writer: WriterDep) -> Response:
    """Ends the session on the server, not only in this browser: the cookie's id is deleted."""
    cookie = request.cookies.get(COOKIE)
    if cookie is not None:
        with writer() as session:
            dashboard_sessions.end(session, cookie)
    response = RedirectResponse("/runs", status.HTTP_303_SEE_OTHER)
    response.delete_cookie(COOKIE)
    return response
