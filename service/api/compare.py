"""Run diff: which items changed between two runs. Thin: parse, authorize, call one function."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy.orm import Session

from service.api.deps import SessionDep, Viewer
from service.db.models import Run
from service.runs.compare import CompareError, RunDiff, diff_runs

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


def _get_run(session: Session, run_id: int) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"run {run_id} does not exist")
    return run


@router.get("/{a}/diff/{b}", response_model=RunDiff)
def diff(
    a: int,
    b: int,
    _: Viewer,
    session: SessionDep,
    arm_a: Annotated[str | None, Query(max_length=16, description="Default: the treatment or only arm")] = None,
    arm_b: Annotated[str | None, Query(max_length=16)] = None,
    top: Annotated[int, Query(ge=1, le=1000, description="WER: how many of the largest changes")] = 50,
) -> RunDiff:
    """Per suite: items right in `a` and wrong in `b` and the reverse (accuracy), or the
    utterances whose word errors changed most (WER), with both responses."""
    try:
        return diff_runs(session, _get_run(session, a), _get_run(session, b), arm_a=arm_a, arm_b=arm_b, top=top)
    except CompareError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
