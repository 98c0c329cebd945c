"""Error bodies and the statuses routes document, so the OpenAPI document says what the service answers."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout


class Problem(BaseModel):
    detail: str


class FieldProblem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class Unprocessable(BaseModel):
    """FastAPI's own validation errors are a list; the service's checks say one sentence."""

    detail: str | list[FieldProblem]


_DESCRIPTIONS = {
    401: "No token, or an unknown, revoked or expired one",
    403: "The token's role does not allow this",
    404: "No such run, profile or token",
    409: "The Idempotency-Key was used before with a different request",
    413: "The request body is over the size limit",
    415: "The body is not UTF-8 JSON under exactly one JSON Content-Type",
    422: "The request is malformed or names something that cannot be used",
    429: "A limit was reached (named in the message: a queue quota, or requests or connections at once); "
    "retry after the seconds in Retry-After",
    503: "The service is saturated; retry after the seconds in Retry-After",
}

_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}}


def documented(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these statuses, each with the body the service really sends."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {
            "model": Unprocessable if code in (415, 422) else Problem,
            "description": _DESCRIPTIONS[code],
        }
        if code in (429, 503):
            entry["headers"] = _RETRY_AFTER
        out[code] = entry
    return out


# What any API route may answer before its own code runs: auth, the request gate, admission.
API_ERRORS = documented(401, 403, 413, 415, 422, 503)


def not_found(what: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, what)


def unprocessable(why: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, why)


DATABASE_BUSY_RETRY_S = 2


async def _database_busy(request: Request, exc: Exception) -> JSONResponse:
    """A pool with no free connection, or a database that is locked or gone: retry later, not a 500."""
    why = f"the database is busy or unreachable ({type(exc).__name__}); retry after {DATABASE_BUSY_RETRY_S} s"
    return JSONResponse(
        {"detail": why},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(DATABASE_BUSY_RETRY_S)},
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(PoolTimeout, _database_busy)
    app.add_exception_handler(OperationalError, _database_busy)
