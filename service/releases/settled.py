"""What is computed once when a run ends, after its last write: never on a read.

The pipeline calls `settle` for every run it ends, wherever it executed (the local worker,
`kvcanary run`, `kvcanary mutants`, a Ray node): a mutation batch's matrix (its turning points)
and, for a run that decides its release's row, the paired comparison with the previous release's
run and the next release's comparison with it. Each in a transaction of its own, so a failure
costs only what it would have stored (a read then computes it), never the run's end.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy.orm import Session

from service.db.models import Run
from service.db.session import session_scope
from service.releases.comparison import store_comparison
from service.releases.summary import deciding_run, next_release, previous_release
from service.runs.batches import settle_run

log = logging.getLogger(__name__)


def settle_release(session: Session, run_id: int, key: str, gate_roles: Sequence[str]) -> int:
    """Store the comparisons of a run that decides its release's row; how many were stored."""
    run = session.get(Run, run_id)
    if run is None or key not in (run.labels or {}):
        return 0
    value = str(run.labels[key])
    mine = deciding_run(session, key, value, run.profile, gate_roles)
    if mine is None or mine.id != run.id:
        return 0
    pairs: list[tuple[Run | None, Run | None]] = []
    before = previous_release(session, key, value)
    if before is not None:
        pairs.append((deciding_run(session, key, before, run.profile, gate_roles), mine))
    after = next_release(session, key, value)
    if after is not None:
        pairs.append((mine, deciding_run(session, key, after, run.profile, gate_roles)))
    stored = 0
    for prev, cur in pairs:
        if prev is not None and cur is not None:
            store_comparison(session, prev, cur)
            stored += 1
    return stored


def settle(url: str, run_id: int, key: str, gate_roles: Sequence[str]) -> None:
    """Everything computed once from an ended run, each in its own transaction; failures are logged."""
    for what, step in (
        ("its mutation batch's matrix", lambda session: settle_run(session, run_id)),
        ("its release comparisons", lambda session: settle_release(session, run_id, key, gate_roles)),
    ):
        try:
            with session_scope(url) as session:
                step(session)
        except Exception:
            log.exception("run %s: %s could not be computed; a read computes it", run_id, what)
