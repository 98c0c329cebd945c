"""Pages about runs: the list, one run's result document, its samples, and two runs compared.

Every number and sentence comes from the same read functions the API uses (`queries`,
`RunDetail`, `diff_runs`), so the dashboard never shows something the API would not.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api.deps import Caller, Offset, SessionDep
from service.auth import Role, allows
from service.dashboard.access import PageCaller
from service.dashboard.render import page
from service.dashboard.views import profile_names, reference_runs, sample_counts, shown_kind
from service.db.models import ARM_NAME_MAX, Run
from service.runs import queries
from service.runs.compare import CompareError, arms_and_suites, diff_runs, pick_arm
from service.runs.state import Status
from service.schemas import INT64_MAX, LABEL_KEY, parse_label_pairs

router = APIRouter(include_in_schema=False)

PAGE_SIZES = (25, 50, 100, 200)
TRIGGERS = ("ci", "nightly", "manual")


def _missing(request: Request, caller: Caller, what: str) -> HTMLResponse:
    return page(request, "missing.html", caller, status.HTTP_404_NOT_FOUND, message=what)


def _run(session: Session, run_id: int) -> Run | None:
    """None for ids no run can have (past 64 bits too): the page says the run does not exist."""
    return session.get(Run, run_id) if 1 <= run_id <= INT64_MAX else None


@router.get("/")
def home() -> Response:
    return RedirectResponse("/runs", status.HTTP_307_TEMPORARY_REDIRECT)


@router.get("/runs", response_class=HTMLResponse)
def runs_page(
    request: Request,
    caller: PageCaller,
    session: SessionDep,
    profile: str = "",
    status_: Annotated[str, Query(alias="status")] = "",
    trigger: str = "",
    label: Annotated[str, Query(max_length=200)] = "",
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=max(PAGE_SIZES))] = 50,
) -> HTMLResponse:
    """Newest first; live rows are refreshed by runs.js from the JSON API with the same filters."""
    labels: dict[str, str] = {}
    problem = ""
    if label:
        try:
            labels = parse_label_pairs([label])
        except ValueError as exc:
            problem = f"label filter: {exc}"
        if not all(re.match(LABEL_KEY, key) for key in labels):
            labels, problem = {}, f"label filter {label!r}: the key must match {LABEL_KEY}"
    listing = queries.list_runs(
        session,
        profile=profile or None,
        status=status_ or None,
        trigger=trigger or None,
        label=labels,
        offset=offset,
        limit=limit,
    )
    filters = {"profile": profile, "status": status_, "trigger": trigger, "label": label if labels else ""}
    api_query = {**{k: v for k, v in filters.items() if v}, "offset": offset, "limit": limit}
    return page(
        request,
        "runs.html",
        caller,
        listing=listing,
        filters=filters,
        api_url=f"/api/v1/runs?{urlencode(api_query)}",
        problem=problem,
        profiles=profile_names(session, list(request.app.state.profiles)),
        statuses=[s.value for s in Status],
        triggers=TRIGGERS,
        page_sizes=PAGE_SIZES,
    )


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(run_id: int, request: Request, caller: PageCaller, session: SessionDep) -> HTMLResponse:
    run = _run(session, run_id)
    if run is None:
        return _missing(request, caller, f"Run {run_id} does not exist.")
    detail = queries.run_detail(session, run, str(request.base_url).rstrip("/"))
    counts = sample_counts(session, run_id)
    stored_arms = {c.arm for c in counts}
    names = detail.variants  # each later arm is diffed against the first, the control
    return page(
        request,
        "run.html",
        caller,
        run=detail,
        counts=counts,
        references=reference_runs(session, run.profile, exclude=run_id),
        arm_pairs=[(names[0], arm) for arm in names[1:] if {names[0], arm} <= stored_arms],
        can_promote=allows(caller.role, Role.ADMIN)
        and run.status in (Status.PASSED.value, Status.FAILED.value)
        and bool(detail.metrics),
    )


@router.get("/runs/{run_id}/samples", response_class=HTMLResponse)
def samples_page(
    run_id: int,
    request: Request,
    caller: PageCaller,
    session: SessionDep,
    suite: str = "",
    arm: str = "",
    wrong_only: bool = False,
    q: Annotated[str, Query(max_length=200)] = "",
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=max(PAGE_SIZES))] = 50,
) -> HTMLResponse:
    """One suite and arm at a time, in the view of its primary metric's kind (worst samples first)."""
    run = _run(session, run_id)
    if run is None:
        return _missing(request, caller, f"Run {run_id} does not exist.")
    stored = arms_and_suites(session, run_id)
    if not stored:
        return page(request, "samples.html", caller, run=run, stored={}, listing=None, chosen={}, count=None)
    try:
        arm = pick_arm(run, stored, arm or None)
    except CompareError as exc:
        return _missing(request, caller, str(exc))
    suite = suite if suite in stored[arm] else stored[arm][0]
    listing = queries.list_samples(
        session, run_id, suite=suite, arm=arm, wrong_only=wrong_only, search=q or None, offset=offset, limit=limit
    )
    count = next(c for c in sample_counts(session, run_id) if (c.arm, c.suite) == (arm, suite))
    chosen = {"suite": suite, "arm": arm, "wrong_only": wrong_only, "q": q}
    kind = shown_kind(suite)
    marked = kind.marks
    marks = {s.key: marked(s.target, s.response) for s in listing.items} if marked is not None else {}
    return page(
        request, "samples.html", caller, run=run, stored=stored, listing=listing, chosen=chosen, count=count,
        kind=kind.name, marks=marks,
    )  # fmt: skip


@router.get("/compare", response_class=HTMLResponse)
def compare_form(
    request: Request,
    caller: PageCaller,
    session: SessionDep,
    a: int | None = None,
    b: int | None = None,
) -> Response:
    if a is not None and b is not None:
        return RedirectResponse(f"/compare/{a}/{b}", status.HTTP_303_SEE_OTHER)
    recent = session.scalars(select(Run).order_by(Run.id.desc()).limit(20)).all()
    return page(request, "compare_form.html", caller, recent=recent)


@router.get("/compare/{a}/{b}", response_class=HTMLResponse)
def compare_page(
    a: int,
    b: int,
    request: Request,
    caller: PageCaller,
    session: SessionDep,
    arm_a: Annotated[str, Query(max_length=ARM_NAME_MAX)] = "",
    arm_b: Annotated[str, Query(max_length=ARM_NAME_MAX)] = "",
    top: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> HTMLResponse:
    """Flipped items side by side: run a (e.g. the reference) on the left, run b on the right."""
    run_a, run_b = _run(session, a), _run(session, b)
    if run_a is None or run_b is None:
        return _missing(request, caller, f"Run {a if run_a is None else b} does not exist.")
    try:
        diff = diff_runs(session, run_a, run_b, arm_a=arm_a or None, arm_b=arm_b or None, top=top)
    except CompareError as exc:
        unprocessable = status.HTTP_422_UNPROCESSABLE_CONTENT
        return page(request, "compare.html", caller, unprocessable, diff=None, problem=str(exc), a=a, b=b)
    return page(request, "compare.html", caller, diff=diff, problem="", a=a, b=b)
