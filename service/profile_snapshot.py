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


def digest(snapshot: Mapping[str, Any]) -> str:
    """A short, stable name of a snapshot: two runs with the same digest ran the same profile."""
    canonical = json.dumps(snapshot, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]
