"""Mutation batches: start one (admin only), and a profile's newest matrix as it was stored."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select

from kernels.mutants import MUTANTS
from service.api.deps import Admin, ProfilesDep, SessionDep, SettingsDep, Viewer, WriterDep
from service.api.errors import documented, not_found, unprocessable
from service.db.models import MutationBatch
from service.profiles import NAME_PATTERN, Variant
from service.runs.admission import RunRefused, engines_start_here, fitted
from service.runs.batches import latest_matrix, start_batch
from service.runs.mutation import MutationMatrix
from service.schemas import check_labels

router = APIRouter(prefix="/api/v1", tags=["catalog"])
BATCH_ID = r"^[0-9A-Za-z._-]{1,64}$"


class BatchCreate(BaseModel):
    """What `kvcanary mutants --url` sends: one batch over one or more profiles."""

    model_config = ConfigDict(extra="forbid")

    batch: str = Field(pattern=BATCH_ID, description="The batch's id; sent again, it returns the same batch")
    profiles: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(min_length=1, max_length=20)
    mutants: list[Variant] = Field(min_length=1, description="The kernel mutants, each an arm against fixed")
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("mutants")
    @classmethod
    def _mutants(cls, mutants: list[str]) -> list[str]:
        unknown = [m for m in mutants if m not in MUTANTS]
        if unknown:
            raise ValueError(f"not kernel mutants: {', '.join(unknown)}; mutants: {', '.join(MUTANTS)}")
        return mutants

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return check_labels(labels)


class BatchOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    batch: str
    profile: str
    run_id: int | None
    started_by: str
    started_role: str
    mutants: list[str]


@router.post(
    "/mutation-batches",
    status_code=status.HTTP_201_CREATED,
    response_model=list[BatchOut],
    responses={200: {"description": "This batch was started before; its records are returned"}, **documented(404)},
)
def create_batch(
    body: BatchCreate,
    response: Response,
    caller: Admin,
    writer: WriterDep,
    profiles: ProfilesDep,
    settings: SettingsDep,
) -> list[BatchOut]:
    """Queue one run per profile, fixed then each mutant, recorded as a mutation batch: the only way
    a batch (and the mutation score pages show) comes to be."""
    missing = [name for name in body.profiles if name not in profiles]
    if missing:
        raise not_found(f"unknown profile {', '.join(missing)}; known profiles: {', '.join(sorted(profiles))}")
    try:
        for name in body.profiles:
            fitted(profiles[name], on_this_host=engines_start_here(settings))
    except RunRefused as exc:
        raise unprocessable(str(exc)) from exc
    with writer() as session:
        found = session.scalars(select(MutationBatch).where(MutationBatch.batch == body.batch)).all()
        if found:
            response.status_code = status.HTTP_200_OK
            return [BatchOut.model_validate(record) for record in found]
        records = [
            start_batch(session, profiles[name], body.mutants, body.batch, body.labels, caller.name, caller.role)
            for name in body.profiles
        ]
        return [BatchOut.model_validate(record) for record in records]


@router.get("/profiles/{name}/mutants", response_model=MutationMatrix, responses=documented(404))
def profile_mutants(
    name: Annotated[str, Path(pattern=NAME_PATTERN)], _: Viewer, session: SessionDep, profiles: ProfilesDep
) -> MutationMatrix:
    """Mutant x suite of the newest mutation batch, as computed when its run ended: caught or not, at
    how many items, how long; and who started the batch, when."""
    profile = profiles.get(name)
    matrix = latest_matrix(session, name, [entry.suite for entry in profile.suites] if profile else [])
    if profile is None and matrix.batch is None:
        raise not_found(f"no profile and no mutation batch named {name!r}")
    return matrix
