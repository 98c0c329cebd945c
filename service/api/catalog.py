"""Profiles and baselines."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from service import baselines
from service.api.deps import Admin, ProfilesDep, RunId, SessionDep, Viewer, WriterDep
from service.api.errors import unprocessable
from service.profiles import NAME_PATTERN
from service.schemas import BaselineOut, BaselineUpdate, ProfileOut

router = APIRouter(prefix="/api/v1", tags=["catalog"])


@router.get("/profiles", response_model=list[ProfileOut])
def list_profiles(_: Viewer, profiles: ProfilesDep) -> list[ProfileOut]:
    return [ProfileOut.of(p) for p in profiles.values()]


@router.get("/baselines", response_model=list[BaselineOut])
def list_baselines(
    _: Viewer,
    session: SessionDep,
    profile: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
) -> list[BaselineOut]:
    return baselines.list_baselines(session, profile)


@router.put("/baselines", response_model=BaselineOut)
def put_baseline(
    change: BaselineUpdate,
    caller: Admin,
    writer: WriterDep,
    profiles: ProfilesDep,
) -> BaselineOut:
    """Change one baseline (value, tolerance, source, reference run); the change is kept in history."""
    try:
        with writer() as session:
            return baselines.update(session, change, caller.name, profiles)
    except baselines.BaselineError as exc:
        raise unprocessable(str(exc)) from exc


@router.get("/baselines/history", response_model=list[dict[str, Any]])
def baseline_history(
    profile: Annotated[str, Query(pattern=NAME_PATTERN)], _: Viewer, session: SessionDep
) -> list[dict[str, Any]]:
    return baselines.history(session, profile)


@router.post("/runs/{run_id}/promote", response_model=list[BaselineOut])
def promote_run(
    run_id: RunId,
    caller: Admin,
    writer: WriterDep,
    profiles: ProfilesDep,
) -> list[BaselineOut]:
    """Make this run the paired reference for each metric it reported."""
    try:
        with writer() as session:
            return baselines.promote(session, run_id, caller.name, profiles)
    except baselines.BaselineError as exc:
        raise unprocessable(str(exc)) from exc
