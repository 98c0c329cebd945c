"""Release pages: the list of releases of a label key, and one release summed up.

Both render the documents the API returns (`release_index`, `release_summary`), so the page,
`GET /api/v1/releases/...` and `kvcanary release-report` show the same words and numbers.
"""

from __future__ import annotations

import re
import shlex
from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import HTMLResponse

from service.api.deps import SessionDep
from service.dashboard.access import PageCaller
from service.dashboard.render import page
from service.releases.summary import ReleaseNotFound, parse_release, release_index, release_summary, releases_of
from service.schemas import LABEL_KEY, MAX_LABEL_VALUE

router = APIRouter(include_in_schema=False)


@router.get("/releases", response_class=HTMLResponse)
def releases_page(
    request: Request, caller: PageCaller, session: SessionDep, key: Annotated[str, Query(max_length=64)] = ""
) -> HTMLResponse:
    """Newest releases first, each ready, blocked or incomplete; an unknown key says so."""
    settings = request.app.state.settings
    key = key or settings.release_label
    if not re.match(LABEL_KEY, key):
        problem = f"{key[:80]!r} is not a label key (it must match {LABEL_KEY})"
        return page(request, "releases.html", caller, status.HTTP_404_NOT_FOUND, index=None, key=key, problem=problem)
    index = release_index(session, key, settings.release_required_profiles, settings.release_gate_roles)
    code = status.HTTP_200_OK if index.releases else status.HTTP_404_NOT_FOUND
    problem = "" if index.releases else f"No run carries a label {key!r}, so there is no release to show."
    return page(request, "releases.html", caller, code, index=index, key=key, problem=problem)


@router.get("/releases/{release:path}", response_class=HTMLResponse)
def release_page(
    release: str,
    request: Request,
    caller: PageCaller,
    session: SessionDep,
    previous: Annotated[str, Query(max_length=MAX_LABEL_VALUE)] = "",
) -> HTMLResponse:
    """The one line (ready, blocked naming what failed, incomplete naming what has not run), then a row
    per profile: its latest run's outcome per suite and arm, and the change since the previous release."""
    settings = request.app.state.settings
    key, value = "", release
    try:
        key, value = parse_release(release)
        summary = release_summary(
            session, key, value, required=settings.release_required_profiles,
            gate_roles=settings.release_gate_roles, profiles=request.app.state.profiles, previous=previous or None,
        )  # fmt: skip
    except ReleaseNotFound as exc:
        recent = [r.value for r in releases_of(session, key)[:10]] if key else []
        return page(
            request, "release.html", caller, status.HTTP_404_NOT_FOUND, summary=None, problem=str(exc), key=key,
            value=value, recent=recent, others=[],
        )  # fmt: skip
    others = [r.value for r in releases_of(session, key) if r.value != value][:50]
    command = f"kvcanary release-report {shlex.quote(f'{key}={value}')}"
    return page(
        request, "release.html", caller, summary=summary, problem="", key=key, value=value, recent=[], others=others,
        command=command,
    )  # fmt: skip
