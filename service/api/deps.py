"""Request dependencies in one place: settings, a DB session per request, profiles, auth."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.auth import Role, allows, lookup, stamp_use
from service.db.session import session_scope
from service.profiles import Profile
from service.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="An API token made with `kvcanary tokens create`")


def get_settings(request: Request) -> Settings:
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


def get_writer(settings: Annotated[Settings, Depends(get_settings)]) -> Writer:
    return Writer(settings.resolved_database_url())


def get_profiles(request: Request) -> dict[str, Profile]:
    profiles: dict[str, Profile] = request.app.state.profiles
    return profiles


@dataclass(frozen=True)
class Caller:
    name: str
    role: str


ANONYMOUS = Caller(name="anonymous", role=Role.VIEWER.value)


def token_from_request(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str | None:
    """A bearer header for clients; the dashboard's login cookie for browsers."""
    if credentials is not None:
        return credentials.credentials
    return request.cookies.get("kvcanary_token")


def require(role: Role) -> Callable[..., Caller]:
    """401 without a valid token, 403 when the token's role does not include `role`.

    Reads (`Role.VIEWER`) are open unless `read_auth` is set.
    """

    def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        settings: Annotated[Settings, Depends(get_settings)],
        session: Annotated[Session, Depends(get_session)],
    ) -> Caller:
        token = token_from_request(request, credentials)
        if token is None:
            if role == Role.VIEWER and not settings.read_auth:
                return ANONYMOUS
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                f"this endpoint needs a token with role {role.value}: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        row = lookup(session, token)
        if row is not None:
            stamp_use(settings.resolved_database_url(), row.id)
        if row is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"}
            )
        if not allows(row.role, role):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"token {row.name!r} has role {row.role}; this needs {role.value}"
            )
        return Caller(name=row.name, role=row.role)

    return dependency


SessionDep = Annotated[Session, Depends(get_session)]
WriterDep = Annotated[Writer, Depends(get_writer)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
ProfilesDep = Annotated[dict[str, Profile], Depends(get_profiles)]
Viewer = Annotated[Caller, Depends(require(Role.VIEWER))]
CI = Annotated[Caller, Depends(require(Role.CI))]
Admin = Annotated[Caller, Depends(require(Role.ADMIN))]
