"""Pages about profiles: the list, and per profile its metric trends, baselines and their history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import HTMLResponse

from service import baselines
from service.api.deps import SessionDep
from service.auth import Role, allows
from service.dashboard.access import PageCaller
from service.dashboard.render import page
from service.dashboard.views import current_threshold, profile_overviews, trends
from service.releases.trends import release_trends
from service.runs.batches import latest_matrix
from service.schemas import ProfileOut

router = APIRouter(include_in_schema=False)

HISTORY_ROWS = 20
RELEASES_SHOWN = 30


@router.get("/profiles", response_class=HTMLResponse)
def profiles_page(request: Request, caller: PageCaller, session: SessionDep) -> HTMLResponse:
    overviews = profile_overviews(session, list(request.app.state.profiles))
    return page(request, "profiles.html", caller, overviews=overviews)


@router.get("/profiles/{name}", response_class=HTMLResponse)
def profile_page(
    name: str,
    request: Request,
    caller: PageCaller,
    session: SessionDep,
    last: Annotated[int, Query(ge=2, le=2000, description="How many of the newest runs the charts show")] = 200,
) -> HTMLResponse:
    """One trend chart per metric: each run's value and CI, coloured by verdict, over the baseline band."""
    loaded = request.app.state.profiles.get(name)
    settings = request.app.state.settings
    series = trends(session, name, last)
    rows = baselines.list_baselines(session, name)
    if loaded is None and not series and not rows:
        return page(
            request, "missing.html", caller, status.HTTP_404_NOT_FOUND, message=f"No profile or runs named {name!r}."
        )
    return page(
        request,
        "profile.html",
        caller,
        name=name,
        profile=ProfileOut.of(loaded) if loaded else None,
        series=series,
        by_release=release_trends(session, name, settings.release_label, RELEASES_SHOWN, settings.release_gate_roles),
        baselines=[(b, current_threshold(b)) for b in rows],
        history=baselines.history(session, name)[:HISTORY_ROWS],
        mutants=latest_matrix(session, name, [entry.suite for entry in loaded.suites] if loaded else []),
        last=last,
        can_edit=allows(caller.role, Role.ADMIN) and loaded is not None,
    )
