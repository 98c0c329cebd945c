"""Schedules: read them with their next/last fire; admins override what the profiles define."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import Admin, ProfilesDep, SessionDep, Viewer, WriterDep
from service.api.errors import unprocessable
from service.scheduling import schedules
from service.scheduling.schemas import ScheduleOut, ScheduleUpdate

router = APIRouter(prefix="/api/v1/schedules", tags=["schedules"])


@router.get("", response_model=list[ScheduleOut])
def list_schedules(_: Viewer, session: SessionDep) -> list[ScheduleOut]:
    return schedules.list_schedules(session)


@router.put("", response_model=ScheduleOut)
def put_schedule(change: ScheduleUpdate, _: Admin, writer: WriterDep, profiles: ProfilesDep) -> ScheduleOut:
    """Change a schedule by name, or create one; from then on its profile's block no longer applies to it."""
    try:
        with writer() as session:
            return schedules.update(session, change, profiles)
    except schedules.ScheduleError as exc:
        raise unprocessable(str(exc)) from exc
