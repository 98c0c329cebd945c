"""Schedule request and response models; the API and CLI render these, never ORM rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.db.models import Schedule, ScheduleFire
from service.profiles import NAME_PATTERN
from service.scheduling.cron import CronError, validate
from service.schemas import check_labels


class FireOut(BaseModel):
    fire_time: datetime
    run_id: int | None
    skipped_reason: str
    created_at: datetime
    skipped_fires: int = Field(1, description="Fires this row stands for: a run of skips for one reason is one row")
    first_fire_time: datetime | None = Field(None, description="The first of those skipped fires, when more than one")

    @classmethod
    def of(cls, row: ScheduleFire) -> FireOut:
        return cls.model_validate(row, from_attributes=True)


class ScheduleOut(BaseModel):
    name: str
    profile: str
    cron: str
    timezone: str
    enabled: bool
    labels: dict[str, str]
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    overridden: bool = Field(
        description="Changed through the API or CLI: the profile's schedule block no longer applies"
    )
    recent_fires: list[FireOut]

    @classmethod
    def of(cls, row: Schedule, fires: list[ScheduleFire]) -> ScheduleOut:
        return cls(
            name=row.name,
            profile=row.profile,
            cron=row.cron,
            timezone=row.timezone,
            enabled=row.enabled,
            labels=row.labels or {},
            next_fire_at=row.next_fire_at,
            last_fire_at=row.last_fire_at,
            overridden=row.overridden,
            recent_fires=[FireOut.of(f) for f in fires],
        )


class ScheduleUpdate(BaseModel):
    """Change a schedule by name (fields left out keep their value), or create one with profile and cron."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"name": "kimi-linear-48b-a3b", "enabled": True},
                {
                    "name": "whisper-nightly-vllm-0.24",
                    "profile": "whisper-large-v3",
                    "cron": "30 1 * * *",
                    "timezone": "Europe/Berlin",
                    "labels": {"vllm_version": "0.24.0"},
                    "enabled": True,
                },
            ]
        },
    )

    name: str = Field(pattern=NAME_PATTERN)
    profile: str | None = Field(None, pattern=NAME_PATTERN)
    cron: str | None = Field(None, max_length=128)
    timezone: str | None = Field(None, max_length=64)
    enabled: bool | None = None
    labels: dict[str, str] | None = Field(None, description="Put on every run this schedule queues")

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        return None if labels is None else check_labels(labels)

    @model_validator(mode="after")
    def _cron_and_zone_valid(self) -> ScheduleUpdate:
        if self.cron is not None or self.timezone is not None:
            try:
                validate(
                    "* * * * *" if self.cron is None else self.cron, "UTC" if self.timezone is None else self.timezone
                )
            except CronError as exc:
                raise ValueError(str(exc)) from exc
        return self

    def changes(self) -> dict[str, Any]:
        return self.model_dump(exclude={"name"}, exclude_none=True)
