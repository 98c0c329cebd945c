"""`/metrics`: the duration histogram is aggregated by the database, and correct on both databases."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session

from service.api import ops
from service.db.models import Run, utcnow
from service.db.session import session_scope
from service.runs.state import Status, transition


class RowCounter:
    """A session that counts the rows the database hands back; each result is read twice, once
    here and once by the caller, from a frozen copy."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.rows = 0

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        frozen = self.session.execute(statement, *args, **kwargs).freeze()
        self.rows += len(frozen().all())
        return frozen()

    def get_bind(self) -> Any:
        return self.session.get_bind()


def _finish(session: Session, profile: str, seconds: float) -> None:
    """A run started `seconds` ago, ended now through the state machine (which records its duration)."""
    run = Run(
        profile=profile,
        status=Status.STARTING_ENGINE.value,
        trigger="api",
        started_at=utcnow() - timedelta(seconds=seconds),
    )
    session.add(run)
    session.flush()
    transition(session, run, Status.ERROR)


def test_a_scrape_reads_a_row_per_profile_not_per_run(database_url: str) -> None:
    durations = {"kimi": [30.0, 61.0, 299.0, 7199.0, 40000.0] * 60, "whisper": [5.0, 650.0] * 100}
    with session_scope(database_url) as session:
        for profile, seconds in durations.items():
            for s in seconds:
                _finish(session, profile, s)
        session.add(Run(profile="kimi", status=Status.QUEUED.value, trigger="api"))
    with session_scope(database_url, write=False) as session:
        counter = RowCounter(session)
        body = ops.metrics(session=counter).body  # type: ignore[arg-type]
    assert counter.rows <= 2 * len(Status), f"{counter.rows} rows read for {sum(map(len, durations.values()))} runs"

    families = {f.name: f for f in text_string_to_metric_families(bytes(body).decode())}
    samples = families["kvcanary_run_duration_seconds"].samples
    for profile, seconds in durations.items():
        mine = {(s.name, s.labels.get("le")): s.value for s in samples if s.labels["profile"] == profile}
        for edge in ops.DURATION_BUCKETS:
            expected = sum(1 for d in seconds if d <= edge)
            assert mine[("kvcanary_run_duration_seconds_bucket", str(float(edge)))] == expected, (profile, edge)
        assert mine[("kvcanary_run_duration_seconds_bucket", "+Inf")] == len(seconds)
        assert mine[("kvcanary_run_duration_seconds_count", None)] == len(seconds)
        assert abs(mine[("kvcanary_run_duration_seconds_sum", None)] - sum(seconds)) < 0.5 * len(seconds)
    queued = {s.value for s in families["kvcanary_queue_length"].samples}
    assert queued == {1.0}
