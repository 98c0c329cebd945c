"""Which text the service can store and serve, and how text it cannot serve is shown instead.

Every entry point (API bodies and queries, CLI options, profile files) asks `text_problem`
before a string reaches the database: a NUL is refused by PostgreSQL's driver, and a lone
surrogate (which a JSON `\\ud800` escape or a non-UTF-8 argv byte makes) cannot be encoded as
UTF-8, so every later page or list that holds it would fail. `shown` is the other side: a
string that got stored anyway is rendered with backslash escapes instead of breaking a read.
No server dependencies: the client's CLI checks its options with it too.
"""

from __future__ import annotations

import unicodedata
from typing import Any

INT64_MAX = 2**63 - 1  # ids, offsets and integers past this cannot be stored
INT64_MIN = -INT64_MAX - 1


def int64(text: str) -> int:
    """An integer written in decimal, as the API takes it from JSON and from an arm's name alike;
    ValueError for one past 64 bits (checked on its length before Python parses thousands of digits)."""
    if len(text.lstrip("-")) > 19 or not INT64_MIN <= int(text) <= INT64_MAX:
        raise ValueError(f"{text[:40]} is out of range for a 64-bit integer")
    return int(text)


# Characters a label may not hold: controls, format characters (zero-width, bidi overrides and
# isolates, the BOM), private use, and line or paragraph separators. Each makes two labels that
# render the same compare unequal, or renders text in an order other than it is stored.
UNSEEN_CATEGORIES = {"Cc": "a control character", "Cf": "a format character", "Co": "a private-use character",
                     "Zl": "a line separator", "Zp": "a paragraph separator"}  # fmt: skip


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored and served as UTF-8 on both databases, or None."""
    if "\x00" in text:
        return "text may not contain NUL (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"text is not valid Unicode: a lone surrogate ({text[exc.start]!a}) at character {exc.start}"
    return None


def unseen_problem(text: str) -> str | None:
    """Why `text` cannot be a label that reads as it is stored (its first unseen character), or None."""
    for at, char in enumerate(text):
        what = UNSEEN_CATEGORIES.get(unicodedata.category(char))
        if what is not None:
            name = unicodedata.name(char, "unnamed")
            return f"U+{ord(char):04X} ({name}, {what}) at character {at} is not allowed: a label must read as stored"
    return None


def nfc(text: str) -> str:
    """`text` in Unicode normal form C, so `café` typed either way is one label."""
    return unicodedata.normalize("NFC", text)


def label_value(text: str) -> str:
    """A label value as stored: NFC; ValueError when it cannot be stored or holds an unseen character."""
    problem = text_problem(text) or unseen_problem(text)
    if problem:
        raise ValueError(problem)
    return nfc(text)


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
