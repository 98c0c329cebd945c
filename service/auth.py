"""API tokens: random secrets shown once, stored only as SHA-256 hashes, each with one role."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.db.models import ApiToken, utcnow
from service.db.session import session_scope
from service.roles import GRANTS, Role

TOKEN_PREFIX = "kvc_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, name: str, role: Role) -> str:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(name=name, role=role.value, token_hash=hash_token(token)))
    return token


def lookup(session: Session, token: str) -> ApiToken | None:
    """The live token row for a presented secret."""
    return session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token), ApiToken.revoked.is_(False)))


def stamp_use(url: str, token_id: int) -> None:
    """Record when a token was last used, in a write transaction of its own."""
    with session_scope(url) as session:
        session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=utcnow()))


def allows(role: str, needed: Role) -> bool:
    return needed in GRANTS[Role(role)]
