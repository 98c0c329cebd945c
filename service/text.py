"""Which text the service can store and serve, and how text it cannot serve is shown instead.

Every entry point (API bodies and queries, CLI options, profile files) asks `text_problem`
before a string reaches the database: a NUL is refused by PostgreSQL's driver, and a lone
surrogate (which a JSON `\\ud800` escape or a non-UTF-8 argv byte makes) cannot be encoded as
UTF-8, so every later page or list that holds it would fail. `shown` is the other side: a
string that got stored anyway is rendered with backslash escapes instead of breaking a read.
No server dependencies: the client's CLI checks its options with it too.
"""

from __future__ import annotations

from typing import Any

INT64_MAX = 2**63 - 1  # ids, offsets and integers past this cannot be stored
INT64_MIN = -INT64_MAX - 1


def int64(text: str) -> int:
    """An integer written in decimal, as the API takes it from JSON and from an arm's name alike;
    ValueError for one past 64 bits (checked on its length before Python parses thousands of digits)."""
    if len(text.lstrip("-")) > 19 or not INT64_MIN <= int(text) <= INT64_MAX:
        raise ValueError(f"{text[:40]} is out of range for a 64-bit integer")
    return int(text)


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored and served as UTF-8 on both databases, or None."""
    if "\x00" in text:
        return "text may not contain NUL (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"text is not valid Unicode: a lone surrogate ({text[exc.start]!a}) at character {exc.start}"
    return None


def storable(text: str) -> str:
    """A pydantic after-validator: `text` unchanged, or ValueError saying what is wrong with it."""
    problem = text_problem(text)
    if problem:
        raise ValueError(problem)
    return text


def shown(text: str) -> str:
    """`text` as it can be sent: a lone surrogate becomes the six characters `\\udXXX`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def shown_everywhere(value: Any) -> Any:
    """`shown` applied to every string in a JSON document, keys included."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {shown(key): shown_everywhere(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shown_everywhere(item) for item in value]
    return value
