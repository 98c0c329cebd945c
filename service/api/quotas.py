"""Queue quotas: everyone may read the limits in force; admins change them (service.runs.quotas)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from service.api.deps import Admin, SessionDep, SettingsDep, Viewer, WriterDep
from service.api.errors import documented
from service.runs import quotas

router = APIRouter(prefix="/api/v1/quotas", tags=["quotas"])


class QuotaOut(BaseModel):
    name: str
    value: int = Field(description="The limit in force")
    default: int = Field(description="The setting's value (KVCANARY_<NAME>), in force until an admin changes it")
    description: str
    changed_by: str | None
    changed_at: datetime | None


class QuotaUpdate(BaseModel):
    """The limits to change; those left out keep their value."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"max_queued_runs_per_token": 40}]})

    max_queued_runs_per_token: int | None = Field(None, ge=1, le=1_000_000)
    max_queued_engine_loads_per_token: int | None = Field(None, ge=1, le=1_000_000)
    max_queued_runs: int | None = Field(None, ge=1, le=1_000_000)


def _out(values: dict[str, quotas.QuotaValue]) -> list[QuotaOut]:
    return [QuotaOut(**vars(value)) for value in values.values()]


@router.get("", response_model=list[QuotaOut])
def list_quotas(_: Viewer, session: SessionDep, settings: SettingsDep) -> list[QuotaOut]:
    """The queue limits in force, their defaults, and who changed them last."""
    return _out(quotas.current(session, settings))


@router.put("", response_model=list[QuotaOut], responses=documented(403))
def put_quotas(change: QuotaUpdate, caller: Admin, writer: WriterDep, settings: SettingsDep) -> list[QuotaOut]:
    """Change queue limits for every replica on this database; runs already queued stay queued."""
    with writer() as session:
        quotas.change(session, change.model_dump(exclude_none=True), f"token {caller.name}")
        session.flush()
        return _out(quotas.current(session, settings))
