"""What a request body must be before any route reads it: one Content-Type, UTF-8 JSON (or the
login form on the dashboard), no deeper than `MAX_DEPTH`, and only text and numbers that both
databases can store.

The request gate checks exactly the bytes that FastAPI will parse, under the one Content-Type
header that FastAPI will read, so no encoding FastAPI detects on its own (UTF-16 and UTF-32
without a byte order mark) and no second header can carry anything past the check.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.types import Scope

from service.text import int64, text_problem

MAX_DEPTH = 32  # the deepest request the API takes is 4 levels; Python's parser gives up near 1,000
JSON_TYPES = "application/json (or application/<name>+json), UTF-8"
FORM_TYPE = "application/x-www-form-urlencoded"


@dataclass
class Refusal(Exception):
    """Why a body is refused: 415 for a media type or encoding the service does not read, 422 for
    content it cannot store; `loc` says where in the body the problem sits."""

    status: int
    msg: str
    loc: tuple[str | int, ...] = ("body",)

    def detail(self) -> list[dict[str, Any]]:
        return [{"loc": list(self.loc), "msg": self.msg, "type": "value_error"}]


def _constant(name: str) -> Any:
    raise Refusal(422, f"{name} is not a number JSON can carry; send a finite number")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise Refusal(422, f"{text[:40]} is out of range for a 64-bit float")
    return value


def _int(text: str) -> int:
    try:
        return int64(text)
    except ValueError as exc:
        raise Refusal(422, str(exc)) from None


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting(text: str) -> int:
    """How deep arrays and objects nest in `text`, counted without recursion (strings skipped)."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _walk(value: Any, loc: tuple[str | int, ...]) -> None:
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise Refusal(422, problem, loc)
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = text_problem(key)
            if problem:
                raise Refusal(422, f"key: {problem}", loc)
            _walk(item, (*loc, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, (*loc, index))


def check_json(body: bytes) -> None:
    """Raise Refusal unless `body` is UTF-8 JSON the service can store. Malformed JSON is refused
    here too: FastAPI parses only bytes this has parsed, so its own encoding detection (UTF-16
    and UTF-32 bodies without a byte order mark) never comes into play."""
    if body.startswith(b"\xef\xbb\xbf"):
        raise Refusal(415, "the body starts with a byte order mark; send UTF-8 JSON without one")
    if b"\x00" in body:
        raise Refusal(415, "the body holds NUL bytes (UTF-16 or UTF-32?); send JSON as UTF-8")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(415, f"the body is not UTF-8 (byte {exc.start}); send JSON as UTF-8") from exc
    if nesting(text) > MAX_DEPTH:
        raise Refusal(422, f"the JSON nests deeper than {MAX_DEPTH} levels")
    try:
        document = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except json.JSONDecodeError as exc:
        raise Refusal(422, f"the body is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from exc
    _walk(document, ("body",))


def _check_form(body: bytes) -> None:
    try:
        text = unquote_to_bytes(body.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(422, f"the form is not UTF-8 once percent-decoded (byte {exc.start})") from exc
    problem = text_problem(text)
    if problem:
        raise Refusal(422, f"form: {problem}")


def content_types(scope: Scope) -> list[bytes]:
    return [value for name, value in scope.get("headers") or [] if name == b"content-type"]


def _is_json(media: str) -> bool:
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def check_body(scope: Scope, body: bytes) -> None:
    """Raise Refusal unless a route may read `body`: exactly one Content-Type, JSON in UTF-8
    (a form only outside /api/, where the login form posts), content the databases can store."""
    declared = content_types(scope)
    if len(declared) != 1:
        got = "none" if not declared else f"{len(declared)} Content-Type headers"
        raise Refusal(415, f"a request body needs exactly one Content-Type header ({JSON_TYPES}); got {got}")
    media, *params = (part.strip().lower() for part in declared[0].decode("latin-1").split(";"))
    charset = next((p.partition("=")[2].strip('" ') for p in params if p.startswith("charset=")), "utf-8")
    if charset not in ("utf-8", "utf8"):
        raise Refusal(415, f"charset {charset[:40]!r} is not read here; send UTF-8")
    if _is_json(media):
        check_json(body)
    elif media == FORM_TYPE and not scope.get("path", "").startswith("/api/"):
        _check_form(body)
    else:
        raise Refusal(415, f"Content-Type {media[:80]!r} is not read here; send {JSON_TYPES}")


def check_target(scope: Scope) -> None:
    """Raise Refusal for a path or query that is not UTF-8 once percent-decoded, or holds a NUL."""
    path = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogatepass")
    for where, raw in (("path", path), ("query", scope.get("query_string") or b"")):
        try:
            text = unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Refusal(422, f"the {where} is not UTF-8 once percent-decoded (byte {exc.start})", (where,)) from exc
        if "\x00" in text:
            raise Refusal(422, f"the {where} may not contain NUL (%00)", (where,))
