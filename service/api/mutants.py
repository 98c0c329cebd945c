"""The mutation matrix of a profile: its newest mutation batch, read from stored runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from service.api.deps import ProfilesDep, SessionDep, Viewer
from service.api.errors import documented, not_found
from service.profiles import NAME_PATTERN
from service.runs.mutation import MutationMatrix, latest_matrix

router = APIRouter(prefix="/api/v1", tags=["catalog"])


@router.get("/profiles/{name}/mutants", response_model=MutationMatrix, responses=documented(404))
def profile_mutants(
    name: Annotated[str, Path(pattern=NAME_PATTERN)], _: Viewer, session: SessionDep, profiles: ProfilesDep
) -> MutationMatrix:
    """Mutant x suite of the newest `kvcanary mutants` batch: caught or not, at how many items, how long."""
    profile = profiles.get(name)
    matrix = latest_matrix(session, name, [entry.suite for entry in profile.suites] if profile else [])
    if profile is None and matrix.batch is None:
        raise not_found(f"no profile and no mutation batch named {name!r}")
    return matrix
