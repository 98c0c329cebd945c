"""Dashboard sessions: what the login cookie holds instead of the API token itself.

A login makes a random secret; the browser keeps it in an HttpOnly cookie and the database
only its SHA-256 hash, with an expiry no later than the token's own. A session ends when it
expires, at logout (its row is deleted), or when its token is revoked or expires: every
lookup joins the token and checks it, so a revoked token's sessions stop at the next request.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.auth import hash_token, live
from service.db.models import ApiToken, DashboardSession, utcnow
from service.db.session import session_scope

SESSION_TTL = timedelta(hours=12)


def start(session: Session, token: ApiToken) -> tuple[str, int]:
    """A new session for a live token: its secret (for the cookie) and its lifetime in seconds.

    Expired sessions of every token are cleared here, so the table holds live logins only.
    """
    now = utcnow()
    session.execute(delete(DashboardSession).where(DashboardSession.expires_at <= now))
    expires_at = now + SESSION_TTL
    if token.expires_at is not None:
        expires_at = min(expires_at, token.expires_at)
    secret = secrets.token_urlsafe(32)
    session.add(DashboardSession(secret_hash=hash_token(secret), token_id=token.id, expires_at=expires_at))
    session.flush()
    return secret, max(1, int((expires_at - now).total_seconds()))


def token_of(session: Session, secret: str) -> ApiToken | None:
    """The live token behind a live session, or None (unknown, logged out, expired, revoked, or of a
    role this service does not know)."""
    now = utcnow()
    return session.scalar(
        select(ApiToken)
        .join(DashboardSession, DashboardSession.token_id == ApiToken.id)
        .where(DashboardSession.secret_hash == hash_token(secret), DashboardSession.expires_at > now, live(now))
    )


def authenticate(url: str, secret: str) -> ApiToken | None:
    """`token_of` in a read transaction of its own, as `service.auth.authenticate` does for tokens."""
    with session_scope(url, write=False) as session:
        return token_of(session, secret)


def end(session: Session, secret: str) -> None:
    """Logout: the session's row is deleted, so its cookie no longer works anywhere."""
    session.execute(delete(DashboardSession).where(DashboardSession.secret_hash == hash_token(secret)))
