"""Token roles and what each includes; free of the database so the client's `--help` can list them."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"
    CI = "ci"
    ADMIN = "admin"


# Which roles a role includes: admin can do what ci can, ci what viewer can.
GRANTS: dict[Role, frozenset[Role]] = {
    Role.VIEWER: frozenset({Role.VIEWER}),
    Role.CI: frozenset({Role.VIEWER, Role.CI}),
    Role.ADMIN: frozenset({Role.VIEWER, Role.CI, Role.ADMIN}),
}
