"""Service settings: one pydantic-settings singleton, every key under the KVCANARY_ prefix."""

from __future__ import annotations

import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.profiles import NAME_PATTERN
from service.schemas import LABEL_KEY

PACKAGED_PROFILES = Path(__file__).resolve().parent / "profiles"
# Who may trigger a run that decides a release: tokens' roles, the scheduler, the CLI on the host.
GATE_ROLES = ("ci", "admin", "scheduler", "host")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVCANARY_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path(".kvcanary"), description="Runs' folders, engine logs and the SQLite file")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite (WAL) in data_dir")
    profiles_dir: Path = Field(PACKAGED_PROFILES, description="Folder of profile YAML files")
    vllm_configs: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="vLLM lm-eval configs read as profiles: files, folders or models-*.txt lists, os.pathsep-separated",
    )
    vllm_tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="Tensor parallel size for vLLM configs (vLLM's harness takes it as --tp-size)"
    )
    engine_python: str = Field(sys.executable, description="Python that has vLLM installed")
    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str | None = Field(None, description="Base URL used in links (alerts, CLI output)")
    read_auth: bool = Field(False, description="Require a token (any role) to read the API and dashboard")
    start_worker: bool = Field(True, description="Run the local executor inside `kvcanary serve`")
    executor: Literal["local", "ray"] = Field("local", description="Where runs execute: here, or on a Ray cluster")
    ray_address: str | None = Field(None, description="Ray cluster to hand runs to, e.g. `head:6379` or `auto`")
    worker_poll_s: float = Field(1.0, gt=0)
    max_body_bytes: int = Field(64 * 1024, gt=0)
    request_threads: int = Field(8, ge=1, le=200, description="Threads that run request handlers")
    max_in_flight: int = Field(
        1024, gt=0, description="API requests served at once; more are answered 503 with Retry-After"
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request's headers must all arrive within this; past it, 408 and the connection closes",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request's body must all arrive within this after its headers; past it, 408"
    )
    max_connections_per_client: int = Field(
        256, gt=0, description="Open connections one client address may hold; past it, 429 with Retry-After"
    )
    max_queued_runs_per_token: int = Field(
        20,
        ge=1,
        description="Queued runs one token may have at once; past it, 429 (admins change it at /api/v1/quotas)",
    )
    max_queued_engine_loads_per_token: int = Field(
        100, ge=1, description="Engine loads (arms x runs) one token may have queued at once; past it, 429"
    )
    max_queued_runs: int = Field(1000, ge=1, description="Queued runs of all tokens together; past it, 429")
    nightly: bool = Field(False, description="Switch on the profiles' nightly schedules (a GPU host sets it)")
    scheduler_tick_s: float = Field(15.0, gt=0, description="How often the scheduler looks for due schedules")
    alert_webhooks: list[str] = Field(default_factory=list, description='Generic JSON webhooks, e.g. ["https://..."]')
    alert_slack_webhooks: list[str] = Field(default_factory=list, description="Slack-compatible webhooks (`text`)")
    alert_attempts: int = Field(4, ge=1, le=10, description="Tries per webhook and alert")
    alert_backoff_s: float = Field(2.0, ge=0, description="Wait before the 2nd try; doubles each try")
    alert_poll_s: float = Field(5.0, gt=0, description="How often the alert watcher looks for finished runs")
    release_label: str = Field("vllm_version", pattern=LABEL_KEY, description="The label key that names a release")
    release_required_profiles: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Profiles every release needs passed, comma-separated"
    )
    release_gate_roles: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(GATE_ROLES),
        description="Roles whose runs may decide a release (ci, admin, scheduler, host), comma-separated",
    )

    @field_validator("vllm_configs", mode="before")
    @classmethod
    def _split_paths(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [Path(part) for part in value.split(os.pathsep) if part.strip()]
        return value

    @field_validator("release_required_profiles", "release_gate_roles", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("release_required_profiles")
    @classmethod
    def _profile_names(cls, names: list[str]) -> list[str]:
        bad = [name for name in names if not re.match(NAME_PATTERN, name)]
        if bad:
            raise ValueError(f"not profile names: {', '.join(map(repr, bad))} (each must match {NAME_PATTERN})")
        return list(dict.fromkeys(names))

    @field_validator("release_gate_roles")
    @classmethod
    def _gate_roles(cls, roles: list[str]) -> list[str]:
        bad = [role for role in roles if role not in GATE_ROLES]
        if bad:
            raise ValueError(
                f"not roles that may gate: {', '.join(map(repr, bad))} (choose from {', '.join(GATE_ROLES)})"
            )
        return list(dict.fromkeys(roles))

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'kvcanary.db').resolve()}"

    def runs_dir(self) -> Path:
        return self.data_dir / "runs"


@lru_cache
def get_settings() -> Settings:
    return Settings()
