"""Runs: trigger, list, read, samples, cancel, delete. Thin: parse, authorize, call one function."""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status

from service.api.deps import (
    CI,
    Admin,
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
from service.api.errors import Problem, documented, not_found, unprocessable
from service.db.models import ARM_NAME_MAX, Run
from service.roles import Role
from service.runs import queries, queue, quotas, removal
from service.runs.admission import RunRefused, admit, engines_start_here
from service.runs.gate_grade import exploratory_reasons, stamp
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
        **documented(404, 409, 429),
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
    """Queue a run of a profile; returns at once. Poll `GET /api/v1/runs/{id}` for progress.

    429 with Retry-After when the caller's queued runs or engine loads, or all queued runs,
    are at their limit (`GET /api/v1/quotas`)."""
    profile = profiles.get(body.profile)
    if profile is None:
        raise not_found(f"unknown profile {body.profile!r}; known profiles: {', '.join(sorted(profiles))}")
    try:
        admitted = admit(profile, body.overrides, body.compare, body.expect, on_this_host=engines_start_here(settings))
    except RunRefused as exc:
        raise unprocessable(str(exc)) from exc
    wanted: dict[str, Any] = {
        "profile": profile.name,
        "trigger": body.trigger,
        "labels": body.labels,
        "overrides": body.overrides.model_dump(exclude_none=True),
        "arms": admitted.plan.stored_arms(),
        "expect": admitted.plan.expect,
    }
    with writer() as session:
        key = scoped_key(caller, idempotency_key) if idempotency_key else None
        if key is None or not queue.key_used(session, key):  # a retry of a queued run costs nothing more
            try:
                quotas.enforce(session, settings, caller.token_id, caller.name, quotas.engine_loads(wanted["arms"]))
            except quotas.QuotaExceeded as exc:
                raise HTTPException(
                    status.HTTP_429_TOO_MANY_REQUESTS, str(exc), headers={"Retry-After": str(exc.retry_after_s)}
                ) from exc
        run, created = queue.enqueue(
            session,
            **wanted,
            triggered_by=caller.name,
            triggered_by_token_id=caller.token_id,
            max_attempts=profile.max_attempts,
            profile_snapshot=admitted.snapshot(),
            idempotency_key=key,
        )
        if created:
            stamp(run, caller.role, exploratory_reasons(profile, body.overrides, body.compare, body.expect))
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
    arm: Annotated[str | None, Query(max_length=ARM_NAME_MAX)] = None,
    wrong_only: bool = False,
    search: Annotated[str | None, Query(max_length=200)] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Page[SampleOut]:
    run_or_404(session, run_id)
    return queries.list_samples(
        session, run_id, suite=suite, arm=arm, wrong_only=wrong_only, search=search, offset=offset, limit=limit
    )


def may_cancel(caller: Caller, run: Run) -> bool:
    """Admins cancel any run; a ci token only the runs it triggered itself."""
    return caller.role == Role.ADMIN or (caller.token_id is not None and caller.token_id == run.triggered_by_token_id)


@router.post("/{run_id}/cancel", response_model=RunDetail, responses=documented(403, 404))
def cancel_run(run_id: RunId, request: Request, caller: CI, writer: WriterDep) -> RunDetail:
    """Queued runs end at once; a running one stops its engine and ends as `cancelled`.

    A ci token may cancel the runs it triggered; any other run needs an admin token.
    """
    with writer() as session:
        run = run_or_404(session, run_id)
        if not may_cancel(caller, run):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"run {run.id} was triggered by {run.triggered_by!r}, not by token {caller.name!r}; "
                "a ci token may cancel only the runs it triggered; ask an admin to cancel this one",
            )
        queue.request_cancel(session, run, caller.name)
        session.flush()
        return queries.run_detail(session, run, _base_url(request))


@router.delete(
    "/{run_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={
        **documented(404),
        409: {"model": Problem, "description": "The run has not ended (cancel it first) or is a baseline's reference"},
    },
)
def delete_run(run_id: RunId, caller: Admin, writer: WriterDep, settings: SettingsDep) -> Response:
    """Delete an ended run with its samples, results and folder; an audit event records it.

    A queued or running run is refused with 409: cancel it, then delete it once it has ended.
    """
    try:
        with writer() as session:
            event = removal.delete_run(session, run_id, f"token {caller.name}")
    except removal.RunNotFound as exc:
        raise not_found(str(exc)) from exc
    except removal.RunInUse as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    removal.remove_folder(event, settings.runs_dir())
    return Response(status_code=status.HTTP_204_NO_CONTENT)
