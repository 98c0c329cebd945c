"""Releases: every profile's latest runs with one label value, judged. Thin: parse, call one function."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from service.api.deps import ProfilesDep, SessionDep, SettingsDep, Viewer
from service.api.errors import documented, not_found
from service.releases.schemas import ReleaseIndex, ReleaseSummary
from service.releases.summary import ReleaseNotFound, parse_release, release_index, release_summary
from service.schemas import LABEL_KEY, MAX_LABEL_VALUE

router = APIRouter(prefix="/api/v1/releases", tags=["releases"])

ReleaseValue = Annotated[str, Query(max_length=MAX_LABEL_VALUE, description="A value of the same label key")]


@router.get("", response_model=ReleaseIndex)
def list_releases(
    _: Viewer,
    session: SessionDep,
    settings: SettingsDep,
    key: Annotated[str | None, Query(pattern=LABEL_KEY, description="Default: KVCANARY_RELEASE_LABEL")] = None,
) -> ReleaseIndex:
    """The newest releases of a label key, each ready, blocked or incomplete from its runs' statuses."""
    return release_index(
        session, key or settings.release_label, settings.release_required_profiles, settings.release_gate_roles
    )


@router.get("/{release:path}", response_model=ReleaseSummary, responses=documented(404))
def get_release(
    release: str,
    request: Request,
    _: Viewer,
    session: SessionDep,
    settings: SettingsDep,
    profiles: ProfilesDep,
    previous: ReleaseValue | None = None,
) -> ReleaseSummary:
    """`key=value` (e.g. `vllm_version=0.25.1`, URL-quoted): per profile its latest decided run's outcome per
    suite and arm, the change against the previous release's run, and ready, blocked or incomplete."""
    try:
        key, value = parse_release(release)
        return release_summary(
            session, key, value, required=settings.release_required_profiles,
            gate_roles=settings.release_gate_roles, profiles=profiles,
            previous=previous, base_url=str(request.base_url).rstrip("/"),
        )  # fmt: skip
    except ReleaseNotFound as exc:
        raise not_found(str(exc)) from exc
