"""Run diff: which items changed between two runs. Thin: parse, authorize, call one function."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import RunId, SessionDep, Viewer, run_or_404
from service.api.errors import documented, unprocessable
from service.runs.compare import CompareError, RunDiff, diff_runs

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


@router.get("/{a}/diff/{b}", response_model=RunDiff, responses=documented(404))
def diff(
    a: RunId,
    b: RunId,
    _: Viewer,
    session: SessionDep,
    arm_a: Annotated[str | None, Query(max_length=32, description="Default: the treatment or only arm")] = None,
    arm_b: Annotated[str | None, Query(max_length=32)] = None,
    top: Annotated[int, Query(ge=1, le=1000, description="WER: how many of the largest changes")] = 50,
) -> RunDiff:
    """Per suite: items right in `a` and wrong in `b` and the reverse (accuracy), or the
    utterances whose word errors changed most (WER), with both responses."""
    try:
        return diff_runs(session, run_or_404(session, a), run_or_404(session, b), arm_a=arm_a, arm_b=arm_b, top=top)
    except CompareError as exc:
        raise unprocessable(str(exc)) from exc
