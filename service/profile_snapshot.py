"""A run's profile as it was triggered, stored as data, and the short name that tells two apart.

Its own module, free of the server's packages: the API schemas that show a run's digest are
the client's too (`pip install kvcanary` without extras).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from service.profiles import Profile


def snapshot_of(profile: Profile) -> dict[str, Any]:
    """The profile as JSON data; `Profile.model_validate` reads it back to the same profile."""
    return profile.model_dump(mode="json")


HIDDEN = "(hidden)"


def for_readers(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The snapshot as the API and the dashboard show it: `engine.env` keeps its names, not its
    values, which may hold a credential (a hub token) that anyone reading a run would see."""
    shown = dict(snapshot)
    engine = shown.get("engine")
    if isinstance(engine, Mapping) and isinstance(engine.get("env"), Mapping):
        shown["engine"] = {**engine, "env": dict.fromkeys(engine["env"], HIDDEN)}
    return shown


def digest(snapshot: Mapping[str, Any]) -> str:
    """A short, stable name of a snapshot: two runs with the same digest ran the same profile."""
    canonical = json.dumps(snapshot, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]
