"""Runs: trigger, list, read, samples, cancel. Thin: parse, authorize, call one function."""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status

from service.api.deps import (
    CI,
    Caller,
    Offset,
    ProfilesDep,
    RunId,
    SessionDep,
    SettingsDep,
    Viewer,
    WriterDep,
    run_or_404,
)
from service.api.errors import documented, not_found, unprocessable
from service.db.models import Run
from service.engine.gpus import refusal
from service.profiles import ProfileError, apply_overrides
from service.runs import queries, queue
from service.schemas import (
    LABEL_KEY,
    MAX_LABEL_FILTERS,
    Page,
    RunCreate,
    RunDetail,
    RunSummary,
    SampleOut,
    parse_label_pairs,
)

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def scoped_key(caller: Caller, key: str) -> str:
    """What is stored for an Idempotency-Key: one caller's key never finds another caller's run."""
    return hashlib.sha256(f"{caller.token_id}\n{key}".encode()).hexdigest()


def differences(run: Run, wanted: dict[str, Any]) -> list[str]:
    """The fields in which a repeated request differs from the one that made `run`."""
    return [name for name, value in wanted.items() if getattr(run, name) != value]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=RunDetail,
    responses={
        200: {"description": "A run with this Idempotency-Key and the same request exists; it is returned"},
        **documented(404, 409),
    },
)
def create_run(
    body: RunCreate,
    request: Request,
    response: Response,
    caller: CI,
    writer: WriterDep,
    profiles: ProfilesDep,
    settings: SettingsDep,
    idempotency_key: Annotated[
        str | None,
        Header(max_length=128, pattern=r"^[\x21-\x7e]+$", description="Per caller: a retry returns the same run"),
    ] = None,
) -> RunDetail:
    """Queue a run of a profile; returns at once. Poll `GET /api/v1/runs/{id}` for progress."""
    profile = profiles.get(body.profile)
    if profile is None:
        raise not_found(f"unknown profile {body.profile!r}; known profiles: {', '.join(sorted(profiles))}")
    try:
        apply_overrides(profile, body.overrides)
    except (ProfileError, ValueError) as exc:
        raise unprocessable(f"overrides: {exc}") from exc
    # This host runs the engine only when its own local worker claims the run; a service without
    # one (an API front for workers elsewhere) or a Ray cluster places it on a host that can.
    unfit = refusal(profile) if settings.executor == "local" and settings.start_worker else None
    if unfit is not None:
        raise unprocessable(unfit)
    wanted: dict[str, Any] = {
        "profile": profile.name,
        "trigger": body.trigger,
        "labels": body.labels,
        "overrides": body.overrides.model_dump(exclude_none=True),
        "variants": list(body.compare or []),
    }
    with writer() as session:
        run, created = queue.enqueue(
            session,
            **wanted,
            triggered_by=caller.name,
            max_attempts=profile.max_attempts,
            idempotency_key=scoped_key(caller, idempotency_key) if idempotency_key else None,
        )
        changed = [] if created else differences(run, wanted)
        if changed:
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"Idempotency-Key {idempotency_key!r} was used for run {run.id} with a different "
                f"{', '.join(changed)}; send a new key for a new run",
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
    profile: Annotated[str | None, Query(max_length=64)] = None,
    status_: Annotated[str | None, Query(alias="status", max_length=24)] = None,
    trigger: Annotated[str | None, Query(max_length=16)] = None,
    label: Annotated[list[str] | None, Query(max_length=MAX_LABEL_FILTERS, description="key=value, repeatable")] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Page[RunSummary]:
    try:
        labels = parse_label_pairs(label or [])
    except ValueError as exc:
        raise unprocessable(f"label filter: {exc}") from exc
    for key in labels:
        if not re.match(LABEL_KEY, key):
            raise unprocessable(f"label filter key {key[:80]!r} must match {LABEL_KEY}")
    return queries.list_runs(
        session, profile=profile, status=status_, trigger=trigger, label=labels, offset=offset, limit=limit
    )


@router.get("/{run_id}", response_model=RunDetail, responses=documented(404))
def get_run(run_id: RunId, request: Request, _: Viewer, session: SessionDep) -> RunDetail:
    return queries.run_detail(session, run_or_404(session, run_id), _base_url(request))


@router.get("/{run_id}/samples", response_model=Page[SampleOut], responses=documented(404))
def get_samples(
    run_id: RunId,
    _: Viewer,
    session: SessionDep,
    suite: Annotated[str | None, Query(max_length=64)] = None,
    arm: Annotated[str | None, Query(max_length=32)] = None,
    wrong_only: bool = False,
    search: Annotated[str | None, Query(max_length=200)] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Page[SampleOut]:
    run_or_404(session, run_id)
    return queries.list_samples(
        session, run_id, suite=suite, arm=arm, wrong_only=wrong_only, search=search, offset=offset, limit=limit
    )


@router.post("/{run_id}/cancel", response_model=RunDetail, responses=documented(404))
def cancel_run(run_id: RunId, request: Request, caller: CI, writer: WriterDep) -> RunDetail:
    """Queued runs end at once; a running one stops its engine and ends as `cancelled`."""
    with writer() as session:
        run = run_or_404(session, run_id)
        queue.request_cancel(session, run, caller.name)
        session.flush()
        return queries.run_detail(session, run, _base_url(request))
