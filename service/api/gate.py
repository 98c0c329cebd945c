"""What the service lets in: bounded bodies, text it can store, numbers it can store, and no more
requests in flight than it can answer in time, served in the order they came.

Checked at the door, so no handler, database driver or page renderer ever meets a lone
surrogate, a NUL, NaN, an infinity or an integer past 64 bits. SQLite would store some of these
and then fail every later read of the row; PostgreSQL refuses them with a driver error; either
way a 500 that the caller cannot act on. What a body must be is in `service.api.body`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.body import Refusal, check_body, check_target


def _refusal(status_code: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)


class _Refused(Exception):
    """Raised into the route that read a refused body; the gate has answered already."""


class RequestGate:
    """Reads the whole body (413 over `limit`, declared or chunked; 408 when it has not all come
    within `deadline_s`) and refuses with 422 a path or query that is not UTF-8 or holds a NUL.
    The body is checked when a route reads it, and only then (`service.api.body.check_body`):
    a route that takes no body never parses one, however deep it nests. A refused body is
    answered here (415 or 422), and the route reading it stops.
    """

    def __init__(self, app: ASGIApp, limit: int, deadline_s: float) -> None:
        self.app = app
        self.limit = limit
        self.deadline_s = deadline_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _refusal(413, f"request body over {self.limit} bytes")
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await too_large(scope, receive, send)
            return
        try:
            check_target(scope)
        except Refusal as problem:
            await _refusal(problem.status, problem.detail())(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        with anyio.move_on_after(self.deadline_s) as clock:
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.limit:
                    await too_large(scope, receive, send)
                    return
                chunks.append(chunk)
                more = message.get("more_body", False)
        if clock.cancelled_caught:
            late = f"the body did not arrive within {self.deadline_s:g} s (KVCANARY_BODY_TIMEOUT_S): {size} bytes came"
            await _refusal(408, late, {"Connection": "close"})(scope, receive, send)
            return
        body = b"".join(chunks)
        replayed = started = answered = False

        async def replay() -> Message:
            nonlocal replayed, answered
            if replayed:
                return await receive()
            replayed = True
            if body:
                try:
                    check_body(scope, body)
                except Refusal as problem:
                    if not started:
                        answered = True
                        await _refusal(problem.status, problem.detail())(scope, receive, send)
                    raise _Refused(problem.msg) from None
            return {"type": "http.request", "body": body, "more_body": False}

        async def guarded_send(message: Message) -> None:
            """The route's own answer, unless the gate has answered for it."""
            nonlocal started
            if answered:
                return
            started = True
            await send(message)

        try:
            await self.app(scope, replay, guarded_send)
        except _Refused:
            return


@dataclass
class Load:
    """API requests in flight against their limit: `Admission` keeps it, `/readyz` reports it."""

    limit: int
    in_flight: int = 0

    @property
    def full(self) -> bool:
        return self.in_flight >= self.limit


class Admission:
    """At most `load.limit` API requests in flight; past that, 503 with Retry-After at once instead
    of a queue that grows until callers time out. Health and metrics are never refused. Placed
    inside the request gate: a request counts only once its whole body is in, so connections
    that never finish sending hold no place."""

    def __init__(self, app: ASGIApp, load: Load, retry_after_s: int = 2) -> None:
        self.app = app
        self.load = load
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/api/"):
            await self.app(scope, receive, send)
            return
        if self.load.full:
            busy = _refusal(
                503,
                f"{self.load.in_flight} requests in flight; retry after {self.retry_after_s} s",
                {"Retry-After": str(self.retry_after_s)},
            )
            await busy(scope, receive, send)
            return
        self.load.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.load.in_flight -= 1


class InTurn:
    """API requests are served `limit` at a time, in the order they came; the rest wait here.

    A request takes several trips through the thread pool (its token check, then its handler,
    then closing its session), and the pool serves trips first come, first served. Let 1,000
    requests in at once and every one of them makes its first trip before any makes its
    second, so no reply leaves until the burst is nearly done. With as many requests inside as
    there are threads, each one goes straight through, and replies leave as runs commit. A turn
    ends when the answer starts: a client slow to read it holds no turn.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.turns = anyio.Semaphore(limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/api/"):
            await self.app(scope, receive, send)
            return
        await self.turns.acquire()
        holding = True

        async def answer(message: Message) -> None:
            nonlocal holding
            if holding and message["type"] == "http.response.start":
                holding = False
                self.turns.release()
            await send(message)

        try:
            await self.app(scope, receive, answer)
        finally:
            if holding:
                self.turns.release()
