"""Tokens for admins: list, create with an expiry, revoke. Secrets are shown once, at creation."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, status

from service import auth
from service.api.deps import Admin, SessionDep, WriterDep
from service.api.errors import Problem, documented, not_found, unprocessable
from service.db.models import utcnow
from service.schemas import INT64_MAX
from service.token_schemas import TokenCreate, TokenCreated, TokenOut

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])


@router.get("", response_model=list[TokenOut])
def list_tokens(_: Admin, session: SessionDep) -> list[TokenOut]:
    return [TokenOut.model_validate(row) for row in auth.list_tokens(session)]


@router.post(
    "",
    response_model=TokenCreated,
    status_code=status.HTTP_201_CREATED,
    responses={409: {"model": Problem, "description": "A token with this name exists; names are unique"}},
)
def create_token(body: TokenCreate, _: Admin, writer: WriterDep) -> TokenCreated:
    """The secret is in this response only; store it now. Token names are unique."""
    lifetime = body.lifetime()
    expires_at = utcnow() + lifetime if lifetime else None
    with writer() as session:
        try:
            secret = auth.create_token(session, body.name, auth.Role(body.role), expires_at)
        except auth.NameTaken as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
        except auth.TokenRefused as exc:
            raise unprocessable(str(exc)) from exc
        row = auth.lookup(session, secret)
        assert row is not None
        return TokenCreated(**TokenOut.model_validate(row).model_dump(), token=secret)


@router.post("/{token_id}/revoke", response_model=TokenOut, responses=documented(404))
def revoke_token(token_id: Annotated[int, Path(ge=1, le=INT64_MAX)], _: Admin, writer: WriterDep) -> TokenOut:
    """From the next request on, the token gets 401."""
    with writer() as session:
        row = auth.revoke(session, token_id)
        if row is None:
            raise not_found(f"token {token_id} does not exist")
        return TokenOut.model_validate(row)
