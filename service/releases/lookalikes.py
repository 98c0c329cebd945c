"""Stored label values that render like another: the ones stored before labels were checked.

Labels are NFC-normalised and refused with a control, format or bidi character at every entry
point now (`service.schemas.check_labels`); values stored before then may still hold them, so
`0.25.1` and `0.25.1` plus a zero-width space are two releases that read the same. `kvcanary
doctor` lists each such value beside the value it looks like, with how many runs carry each.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Run
from service.text import UNSEEN_CATEGORIES, nfc, unseen_problem


@dataclass(frozen=True)
class LookAlike:
    key: str
    value: str
    runs: int
    problem: str  # what is wrong with the value itself ("" when only another value looks like it)
    looks_like: list[tuple[str, int]]  # the other stored values it renders as, with their runs


def _seen(value: str) -> str:
    """What a reader sees: NFC, with every unseen character dropped."""
    return nfc("".join(c for c in value if unicodedata.category(c) not in UNSEEN_CATEGORIES))


def lookalikes(session: Session) -> list[LookAlike]:
    """Every stored label value that is not NFC, holds an unseen character, or reads like another value."""
    counts: Counter[tuple[str, str]] = Counter()
    for labels in session.scalars(select(Run.labels)):
        for key, value in (labels or {}).items():
            counts[(key, str(value))] += 1
    groups: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for (key, value), runs in counts.items():
        groups.setdefault((key, _seen(value)), []).append((value, runs))
    found = []
    for (key, _), values in sorted(groups.items()):
        for value, runs in values:
            problem = unseen_problem(value) or ("not in Unicode normal form C" if nfc(value) != value else "")
            others = [(v, n) for v, n in values if v != value]
            if problem or others:
                found.append(LookAlike(key, value, runs, problem, others))
    return found
