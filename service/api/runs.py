"""Runs: trigger, list, read, samples, cancel. Thin: parse, authorize, call one function."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from sqlalchemy.orm import Session

from service.api.deps import CI, ProfilesDep, SessionDep, SettingsDep, Viewer, WriterDep
from service.db.models import Run
from service.engine.gpus import refusal
from service.profiles import ProfileError, apply_overrides
from service.runs import queries, queue
from service.schemas import Page, RunCreate, RunDetail, RunSummary, SampleOut

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _get_run(session: Session, run_id: int) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"run {run_id} does not exist")
    return run


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=RunDetail,
    responses={200: {"description": "A run with this Idempotency-Key already exists; it is returned"}},
)
def create_run(
    body: RunCreate,
    request: Request,
    response: Response,
    caller: CI,
    writer: WriterDep,
    profiles: ProfilesDep,
    settings: SettingsDep,
    idempotency_key: Annotated[str | None, Header(max_length=128, pattern=r"^[\x21-\x7e]+$")] = None,
) -> RunDetail:
    """Queue a run of a profile; returns at once. Poll `GET /api/v1/runs/{id}` for progress."""
    profile = profiles.get(body.profile)
    if profile is None:
        known = ", ".join(sorted(profiles))
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown profile {body.profile!r}; known profiles: {known}")
    try:
        apply_overrides(profile, body.overrides)
    except (ProfileError, ValueError) as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"overrides: {exc}") from exc
    unfit = refusal(profile) if settings.executor == "local" else None
    if unfit is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, unfit)
    with writer() as session:
        run, created = queue.enqueue(
            session,
            profile=profile.name,
            trigger=body.trigger,
            triggered_by=caller.name,
            labels=body.labels,
            overrides=body.overrides.model_dump(exclude_none=True),
            variants=list(body.compare or []),
            max_attempts=profile.max_attempts,
            idempotency_key=idempotency_key,
        )
        session.flush()
        detail = queries.run_detail(session, run, _base_url(request))
    if not created:
        response.status_code = status.HTTP_200_OK
    return detail


@router.get("", response_model=Page[RunSummary])
def list_runs(
    _: Viewer,
    session: SessionDep,
    profile: str | None = None,
    status_: Annotated[str | None, Query(alias="status")] = None,
    trigger: str | None = None,
    label: Annotated[list[str] | None, Query(description="key=value, repeatable")] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Page[RunSummary]:
    labels = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"label filter {item!r} must be key=value")
        labels[key] = value
    return queries.list_runs(
        session, profile=profile, status=status_, trigger=trigger, label=labels, offset=offset, limit=limit
    )


@router.get("/{run_id}", response_model=RunDetail)
def get_run(
    run_id: int,
    request: Request,
    _: Viewer,
    session: SessionDep,
) -> RunDetail:
    return queries.run_detail(session, _get_run(session, run_id), _base_url(request))


@router.get("/{run_id}/samples", response_model=Page[SampleOut])
def get_samples(
    run_id: int,
    _: Viewer,
    session: SessionDep,
    suite: str | None = None,
    arm: str | None = None,
    wrong_only: bool = False,
    search: Annotated[str | None, Query(max_length=200)] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Page[SampleOut]:
    _get_run(session, run_id)
    return queries.list_samples(
        session, run_id, suite=suite, arm=arm, wrong_only=wrong_only, search=search, offset=offset, limit=limit
    )


@router.post("/{run_id}/cancel", response_model=RunDetail)
def cancel_run(run_id: int, request: Request, caller: CI, writer: WriterDep) -> RunDetail:
    """Queued runs end at once; a running one stops its engine and ends as `cancelled`."""
    with writer() as session:
        run = _get_run(session, run_id)
        queue.request_cancel(session, run, caller.name)
        session.flush()
        return queries.run_detail(session, run, _base_url(request))
