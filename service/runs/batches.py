"""Mutation batches as records: who started one, when, on which run, and its matrix computed once.

A batch is made only by `kvcanary mutants` (on the host, or through the admin-only
`POST /api/v1/mutation-batches`) or by the scheduler, never by a label: the `mutation_batch`
label a batch's run carries is refused from every trigger, and pages read the newest record,
not the newest label. The matrix (with each caught cell's turning point, a search quadratic in
the items) is computed when the batch's run ends (`settle_run`, which `service.releases.settled`
calls after the run's last write) and stored on the record; a read returns it as stored. Until then a read
builds the matrix from the results stored so far, without turning points.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import MutationBatch, Run, utcnow
from service.profiles import Profile
from service.runs.gate_grade import BATCH, stamp
from service.runs.mutation import MutationMatrix, compute_matrix, enqueue_batch
from service.runs.state import FINAL

log = logging.getLogger(__name__)
BATCH_ROLES = ("admin", "host", "scheduler")  # who may start a batch


def start_batch(
    session: Session,
    profile: Profile,
    mutants: Sequence[str],
    batch: str,
    labels: Mapping[str, str],
    by: str,
    role: str,
) -> MutationBatch:
    """Queue the batch's run (exploratory: it never decides a release) and record the batch."""
    if role not in BATCH_ROLES:
        raise PermissionError(f"role {role!r} may not start a mutation batch; {', '.join(BATCH_ROLES)} may")
    run_id = enqueue_batch(session, profile, mutants, batch, labels, by)
    run = session.get(Run, run_id)
    assert run is not None
    stamp(run, role, BATCH)
    record = MutationBatch(
        batch=batch, profile=profile.name, run_id=run_id, started_by=by, started_role=role,
        mutants=list(dict.fromkeys(mutants)),
    )  # fmt: skip
    session.add(record)
    session.flush()
    return record


def latest_batch(session: Session, profile: str) -> MutationBatch | None:
    return session.scalar(
        select(MutationBatch).where(MutationBatch.profile == profile).order_by(MutationBatch.id.desc()).limit(1)
    )


def _with_origin(matrix: MutationMatrix, record: MutationBatch) -> MutationMatrix:
    return matrix.model_copy(
        update={
            "started_by": record.started_by,
            "started_role": record.started_role,
            "started_at": record.started_at,
            "settled_at": record.settled_at,
        }
    )


def latest_matrix(session: Session, profile: str, suites: Sequence[str] = ()) -> MutationMatrix:
    """The matrix of the profile's newest batch record: as stored when its run ended, or, while
    it runs, from its results so far (no turning points); empty when the profile has no batch."""
    record = latest_batch(session, profile)
    if record is None:
        return MutationMatrix(profile=profile, batch=None, suites=list(suites), rows=[], caught=0, judged=0)
    if record.matrix is not None:
        return _with_origin(MutationMatrix.model_validate(record.matrix), record)
    matrix = compute_matrix(session, profile, record.batch, record.run_id, suites, turning_points=False)
    return _with_origin(matrix, record)


def settle_run(session: Session, run_id: int) -> bool:
    """Compute and store the matrix of the batch whose run `run_id` is, once it has ended (columns in
    the order of the suites of the profile the run kept); whether there was one to settle."""
    record = session.scalar(select(MutationBatch).where(MutationBatch.run_id == run_id))
    run = session.get(Run, run_id)
    if record is None or run is None or run.status not in {s.value for s in FINAL}:
        return False
    suites = [str(entry["suite"]) for entry in (run.profile_snapshot or {}).get("suites", [])]
    matrix = compute_matrix(session, record.profile, record.batch, run_id, suites)
    record.matrix = matrix.model_dump(mode="json")
    record.settled_at = utcnow()
    log.info(
        "mutation batch %s of %s settled: %s of %s seen", record.batch, record.profile, matrix.caught, len(matrix.rows)
    )
    return True


def unsettled(session: Session) -> list[int]:
    """Runs of batches that ended without a stored matrix (a run that ended before batches were records)."""
    finals = [s.value for s in FINAL]
    query = select(MutationBatch.run_id).join(Run, Run.id == MutationBatch.run_id)
    return list(session.scalars(query.where(MutationBatch.matrix.is_(None), Run.status.in_(finals))))
