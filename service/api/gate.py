"""What the service lets in: bounded bodies, text it can store, numbers it can store, and no more
requests in flight than it can answer in time.

Checked once at the door for every route, so no handler, database driver or page renderer
ever meets a lone surrogate, a NUL, NaN, an infinity or an integer past 64 bits. SQLite
would store some of these and then fail every later read of the row; PostgreSQL refuses
them with a driver error; either way a 500 that the caller cannot act on.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.schemas import INT64_MAX

INT64_MIN = -INT64_MAX - 1


class Unstorable(ValueError):
    """A value the database cannot keep; `loc` says where in the body it sits."""

    def __init__(self, loc: list[str | int], msg: str) -> None:
        super().__init__(msg)
        self.loc = loc
        self.msg = msg


def _constant(name: str) -> Any:
    raise Unstorable([], f"{name} is not a number JSON can carry; send a finite number")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise Unstorable([], f"{text} is out of range for a 64-bit float")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or not INT64_MIN <= int(text) <= INT64_MAX:
        raise Unstorable([], f"{text[:40]} is out of range for a 64-bit integer")
    return int(text)


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored and served as UTF-8 on both databases, or None."""
    if "\x00" in text:
        return "text may not contain NUL (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text is not valid Unicode (a lone surrogate such as \\ud800)"
    return None


def _walk(value: Any, loc: list[str | int]) -> None:
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise Unstorable(loc, problem)
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = text_problem(key)
            if problem:
                raise Unstorable(loc, f"key: {problem}")
            _walk(item, [*loc, key])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, [*loc, index])


def check_json(body: bytes) -> None:
    """Raise Unstorable for storable-looking JSON that is not; leave malformed JSON to FastAPI."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unstorable(["body"], f"the body is not UTF-8 (byte {exc.start})") from exc
    try:
        document = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except Unstorable as exc:
        raise Unstorable(["body"], exc.msg) from exc
    except ValueError:
        return  # not JSON at all: FastAPI answers it with its own 422
    _walk(document, ["body"])


def _refusal(status_code: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)


def _is_json(scope: Scope) -> bool:
    content_type = dict(scope.get("headers") or []).get(b"content-type", b"").split(b";")[0].strip().lower()
    return content_type in (b"", b"application/json") or content_type.endswith(b"+json")


class RequestGate:
    """Reads the whole body (413 over `limit`, declared or chunked), then refuses with 422 any
    NUL in the path or query and any JSON text or number that cannot be stored."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _refusal(413, f"request body over {self.limit} bytes")
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
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
        body = b"".join(chunks)
        problem = self._problem(scope, body)
        if problem is not None:
            await _refusal(422, [{"loc": problem.loc, "msg": problem.msg, "type": "value_error"}])(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    def _problem(scope: Scope, body: bytes) -> Unstorable | None:
        if "\x00" in scope.get("path", ""):
            return Unstorable(["path"], "the path may not contain NUL")
        if b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
            return Unstorable(["query"], "the query may not contain NUL (%00)")
        if body and _is_json(scope):
            try:
                check_json(body)
            except Unstorable as exc:
                return exc
        return None


class Admission:
    """At most `limit` API requests in flight; past that, 503 with Retry-After at once instead
    of a queue that grows until callers time out. Health and metrics are never refused."""

    def __init__(self, app: ASGIApp, limit: int, retry_after_s: int = 2) -> None:
        self.app = app
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/api/"):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            busy = _refusal(
                503,
                f"{self.in_flight} requests in flight; retry after {self.retry_after_s} s",
                {"Retry-After": str(self.retry_after_s)},
            )
            await busy(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
