"""Request and response models of the token API (`service.api.tokens`): admins only."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from service.durations import EXAMPLES, parse_duration
from service.profiles import NAME_PATTERN


class TokenOut(BaseModel):
    """A token as admins see it; never its secret."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    role: str
    created_at: datetime
    last_used_at: datetime | None = Field(description="Recorded at most once a minute")
    expires_at: datetime | None
    revoked: bool


class TokenCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"name": "github-actions", "role": "ci", "expires_in_days": 90}]},
    )

    name: str = Field(pattern=NAME_PATTERN, description="Who or what holds it")
    role: Literal["viewer", "ci", "admin"]
    expires_in_days: StrictInt | None = Field(None, ge=1, le=3650, description="Left out: the token does not expire")
    expires_in: str | None = Field(
        None, max_length=16, description=f"Lifetime as the CLI takes it, e.g. {EXAMPLES}; instead of expires_in_days"
    )

    @field_validator("expires_in")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value, "expires_in")
        return value

    @model_validator(mode="after")
    def _one_lifetime(self) -> TokenCreate:
        if self.expires_in is not None and self.expires_in_days is not None:
            raise ValueError("give expires_in or expires_in_days, not both")
        return self

    def lifetime(self) -> timedelta | None:
        """How long the token lives; None: it does not expire."""
        if self.expires_in is not None:
            return parse_duration(self.expires_in, "expires_in")
        return timedelta(days=self.expires_in_days) if self.expires_in_days else None


class TokenCreated(TokenOut):
    token: str = Field(description="Shown once; only its hash is stored")
