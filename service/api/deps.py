"""Request dependencies in one place: settings, DB sessions, profiles, auth, and bounded ids."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service import dashboard_sessions
from service.api.errors import not_found
from service.auth import Role, allows, authenticate, use_stamps
from service.db.models import ApiToken, Run
from service.db.session import session_scope
from service.profiles import Profile
from service.schemas import INT64_MAX
from service.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="An API token made with `kvcanary tokens create`")

# Ids and offsets end up as 64-bit integers in SQL; larger ones are refused with 422, not a driver error.
RunId = Annotated[int, Path(ge=1, le=INT64_MAX)]
Offset = Annotated[int, Query(ge=0, le=INT64_MAX)]


async def get_settings(request: Request) -> Settings:
    """Async, like the other dependencies that do no I/O: no thread-pool hop per request."""
    settings: Settings = request.app.state.settings
    return settings


def get_session(settings: Annotated[Settings, Depends(get_settings)]) -> Iterator[Session]:
    """A read session for the whole request. Writes go through `Writer` instead."""
    with session_scope(settings.resolved_database_url(), write=False) as session:
        yield session


@dataclass(frozen=True)
class Writer:
    """Opens a write transaction inside the endpoint's own code: `with writer() as session:`.

    Kept out of dependency set-up and tear-down, which run in other threads, so a write lock
    is never held while the request waits for a thread (see service.db.session).
    """

    url: str

    def __call__(self) -> AbstractContextManager[Session]:
        return session_scope(self.url)


async def get_writer(settings: Annotated[Settings, Depends(get_settings)]) -> Writer:
    return Writer(settings.resolved_database_url())


async def get_profiles(request: Request) -> dict[str, Profile]:
    profiles: dict[str, Profile] = request.app.state.profiles
    return profiles


def run_or_404(session: Session, run_id: int) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise not_found(f"run {run_id} does not exist")
    return run


@dataclass(frozen=True)
class Caller:
    name: str
    role: str
    token_id: int | None = None


ANONYMOUS = Caller(name="anonymous", role=Role.VIEWER.value)


# The dashboard's session cookie: a random session id (service.dashboard_sessions), never a token.
COOKIE = "kvcanary_session"
CSRF_HEADER = "X-CSRF-Token"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def csrf_token(secret: str) -> str:
    """The value a page sends back with its changes: derived from the session cookie, which another
    site can make a browser send but never read, so it cannot know this either."""
    return hashlib.sha256(b"kvcanary-csrf\n" + secret.encode("utf-8", errors="surrogatepass")).hexdigest()


def check_csrf(request: Request, cookie: str) -> None:
    """A change (any method but GET/HEAD/OPTIONS) made with the session cookie must also carry
    the CSRF header the dashboard's pages send; without it, 403."""
    if request.method in _SAFE_METHODS:
        return
    sent = request.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(sent.encode("utf-8", errors="replace"), csrf_token(cookie).encode()):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"a change made with the login cookie needs the {CSRF_HEADER} header that the dashboard's pages send",
        )


def _anonymous(settings: Settings, role: Role) -> Caller:
    if role == Role.VIEWER and not settings.read_auth:
        return ANONYMOUS
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        f"this endpoint needs a token with role {role.value}: send 'Authorization: Bearer <token>'",
        headers={"WWW-Authenticate": "Bearer"},
    )


def caller_for(token: str | None, settings: Settings, role: Role) -> Caller:
    """401 without a live token, 403 when its role does not include `role`.

    Reads (`Role.VIEWER`) are open unless `read_auth` is set. The token is looked up in a
    transaction of its own: no connection stays checked out for the rest of the request.
    """
    if token is None:
        return _anonymous(settings, role)
    row = authenticate(settings.resolved_database_url(), token)
    if row is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "unknown, revoked or expired token, or one whose role this service does not know",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return _admitted(row, settings, role)


def session_caller(cookie: str | None, settings: Settings, role: Role) -> Caller:
    """`caller_for` for the dashboard's session cookie: 401 when the session has ended."""
    if cookie is None:
        return _anonymous(settings, role)
    row = dashboard_sessions.authenticate(settings.resolved_database_url(), cookie)
    if row is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "the dashboard session has ended (logged out, expired, or its token revoked); log in again",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return _admitted(row, settings, role)


def _admitted(row: ApiToken, settings: Settings, role: Role) -> Caller:
    use_stamps.note(settings.resolved_database_url(), row)
    if not allows(row.role, role):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"token {row.name!r} has role {row.role}; this needs {role.value}"
        )
    return Caller(name=row.name, role=row.role, token_id=row.id)


def require(role: Role) -> Callable[..., Caller]:
    def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        settings: Annotated[Settings, Depends(get_settings)],
    ) -> Caller:
        """A bearer header for clients; the dashboard's session cookie (with its CSRF header
        on changes) for browsers."""
        if credentials is not None:
            return caller_for(credentials.credentials, settings, role)
        cookie = request.cookies.get(COOKIE)
        if cookie is not None:
            check_csrf(request, cookie)
        return session_caller(cookie, settings, role)

    return dependency


SessionDep = Annotated[Session, Depends(get_session)]
WriterDep = Annotated[Writer, Depends(get_writer)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
ProfilesDep = Annotated[dict[str, Profile], Depends(get_profiles)]
Viewer = Annotated[Caller, Depends(require(Role.VIEWER))]
CI = Annotated[Caller, Depends(require(Role.CI))]
Admin = Annotated[Caller, Depends(require(Role.ADMIN))]
