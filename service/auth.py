"""API tokens: random secrets shown once, stored only as SHA-256 hashes, each with one role, a
unique name, an optional expiry, and a revoked flag that takes effect on the next request
(revoking also ends the token's dashboard sessions)."""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, delete, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.models import ApiToken, DashboardSession, utcnow
from service.db.session import session_scope
from service.roles import GRANTS, Role

log = logging.getLogger(__name__)

TOKEN_PREFIX = "kvc_"
STAMP_EVERY = timedelta(minutes=1)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).hexdigest()


class TokenRefused(ValueError):
    """A token that must not be made: its expiry has passed, or its name is taken."""


class NameTaken(TokenRefused):
    pass


def create_token(session: Session, name: str, role: Role, expires_at: datetime | None = None) -> str:
    """A new secret; only its hash is stored, so it cannot be shown again.

    Names are unique (they say who triggered or changed what), and a token that would be
    expired on creation is refused rather than made useless in silence.
    """
    if expires_at is not None and expires_at <= utcnow():
        raise TokenRefused(f"expiry {expires_at:%Y-%m-%d %H:%M} UTC has already passed; give a time in the future")
    holder = session.scalar(select(ApiToken).where(ApiToken.name == name))
    if holder is not None:
        raise _name_taken(holder)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(name=name, role=role.value, token_hash=hash_token(token), expires_at=expires_at))
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError as exc:  # created by another request since the check above
        holder = session.scalar(select(ApiToken).where(ApiToken.name == name))
        if holder is None:
            raise
        raise _name_taken(holder) from exc
    return token


def _name_taken(holder: ApiToken) -> NameTaken:
    state = "revoked" if holder.revoked else "active"
    return NameTaken(
        f"a token named {holder.name!r} exists (id {holder.id}, {state}); token names are unique: pick another"
    )


def live(now: datetime) -> ColumnElement[bool]:
    """What makes a token row usable: not revoked, not expired, and a role this service knows.
    A role renamed or emptied in the database is no role: the token is refused like a revoked one."""
    return and_(
        ApiToken.revoked.is_(False),
        or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now),
        ApiToken.role.in_([role.value for role in Role]),
    )


def lookup(session: Session, token: str) -> ApiToken | None:
    """The live token row for a presented secret (`live`)."""
    return session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token), live(utcnow())))


def authenticate(url: str, token: str) -> ApiToken | None:
    """`lookup` in a read transaction of its own, so no connection is held for the rest of the request."""
    with session_scope(url, write=False) as session:
        return lookup(session, token)


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke(session: Session, token_id: int) -> ApiToken | None:
    """Revoke a token by id; the next request that presents it gets 401. None if there is no such token."""
    row = session.get(ApiToken, token_id)
    if row is not None:
        row.revoked = True
        session.execute(delete(DashboardSession).where(DashboardSession.token_id == token_id))
    return row


def allows(role: str, needed: Role) -> bool:
    return needed in GRANTS[Role(role)]


class UseStamps:
    """Records when tokens were last used: at most once a minute per token, in a background
    thread, so a read never writes and a burst of requests never queues for SQLite's write lock."""

    def __init__(self) -> None:
        self._pending: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="token-stamps")

    def note(self, url: str, row: ApiToken) -> None:
        if row.last_used_at is not None and utcnow() - row.last_used_at < STAMP_EVERY:
            return
        with self._lock:
            if (url, row.id) in self._pending:
                return
            self._pending.add((url, row.id))
        self._writer.submit(self._stamp, url, row.id)

    def _stamp(self, url: str, token_id: int) -> None:
        try:
            with session_scope(url) as session:
                session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=utcnow()))
        except Exception:  # a missed stamp is harmless; the next use a minute later tries again
            log.warning("could not record the use of token %s", token_id, exc_info=True)
        finally:
            with self._lock:
                self._pending.discard((url, token_id))


use_stamps = UseStamps()
