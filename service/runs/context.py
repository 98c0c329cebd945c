"""What one attempt of a run executes with: the run's id, the profile as executed, and factories
for database sessions and engines.

The pipeline, its arms and scoring take a `RunContext` instead of a database URL and a run id,
so every write goes through `owned()`: a transaction on the run's row, locked, that refuses to
write (`RunLost`) once the run is no longer this worker's (re-queued by a recovery elsewhere,
ended by a cancel that gave up waiting). Tests give `engines` a stand-in where they are about
orchestration; by default an arm's engine is vLLM started by `service.engine.launcher`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from evals import fixtures
from service.db.models import Run, RunEvent
from service.db.session import session_scope
from service.engine.launcher import Engine
from service.profiles import Profile
from service.runs.admission import executed_profile
from service.runs.state import ACTIVE, Status, transition
from service.settings import Settings


class RunLost(RuntimeError):
    """The run is no longer this worker's: nothing more of this attempt may be written."""


class ArmEngine(Protocol):
    """What the pipeline uses of an arm's engine (`service.engine.Engine`)."""

    url: str
    version: str | None
    models: list[dict[str, Any]]
    startup_s: float | None
    log_path: Path
    stop_event: threading.Event

    @property
    def pid(self) -> int: ...

    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def death_symptom(self) -> str | None: ...

    def log_tail(self, lines: int = ...) -> str: ...

    def receipts(self) -> list[dict[str, Any]]: ...

    def switch(self, profile: Profile, run_dir: Path) -> dict[str, Any]:
        """Serve the next arm (started `switchable`); SwitchError when it cannot."""
        ...


class EngineFactory(Protocol):
    """An arm's engine, not started: `switchable` when the arms after it may share it."""

    def __call__(
        self, profile: Profile, folder: Path, stop_event: threading.Event, *, switchable: bool
    ) -> ArmEngine: ...


SessionFactory = Callable[[], AbstractContextManager[Session]]


def vllm_engines(settings: Settings) -> EngineFactory:
    """The real engine factory: vLLM with the profile's settings, in the arm's folder."""

    def start(profile: Profile, folder: Path, stop_event: threading.Event, *, switchable: bool) -> ArmEngine:
        return Engine(profile, folder, python=settings.engine_python, stop_event=stop_event, switchable=switchable)

    return start


def resolve_profile(profile: Profile) -> Profile:
    """The profile with its `fixture:` references built: on the host that executes the run, since
    a fixture is a path there (a run's snapshot keeps the references)."""
    data = profile.model_dump()
    data["model"] = fixtures.resolve(data["model"])
    for entry in data["suites"]:
        for key, value in entry.items():
            if isinstance(value, str):
                entry[key] = fixtures.resolve(value)
    return Profile.model_validate(data)


def locked_run(session: Session, run_id: int) -> Run | None:
    """The run's row, locked until the transaction ends (SQLite: its write transaction locks all)."""
    query = select(Run).where(Run.id == run_id)
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()
    return session.scalar(query)


def owns(run: Run | None, worker_id: str) -> bool:
    """Whether the run still exists, is this worker's and has not ended: the only state it may write."""
    return run is not None and run.worker_id == worker_id and run.status in {s.value for s in ACTIVE}


@contextmanager
def owned_run(sessions: SessionFactory, run_id: int, worker_id: str) -> Iterator[tuple[Session, Run]]:
    """`RunContext.owned`, for a run whose context could not be opened."""
    with sessions() as session:
        run = locked_run(session, run_id)
        if run is None or not owns(run, worker_id):
            state = "deleted" if run is None else f"{run.status}, worker {run.worker_id}"
            raise RunLost(f"run {run_id} is no longer this worker's ({state})")
        yield session, run


@dataclass
class RunContext:
    """One claimed run as this worker executes it; `timings` and `log_tail` gather what the
    attempt measured until the run's end writes them."""

    run_id: int
    settings: Settings
    profile: Profile
    worker_id: str
    sessions: SessionFactory
    engines: EngineFactory
    arms: list[dict[str, Any]]
    timings: dict[str, Any] = field(default_factory=dict)
    log_tail: str = ""

    @classmethod
    def open(
        cls,
        run_id: int,
        settings: Settings,
        profiles: Mapping[str, Profile],
        worker_id: str,
        engines: EngineFactory | None = None,
    ) -> RunContext:
        """The context of a run `worker_id` claimed: its profile is the one it was triggered with
        (`admission.executed_profile`), fixtures built. RunRefused (or the fixture's error) when
        it cannot execute here; `refuse` ends the run with it."""
        sessions = partial(session_scope, settings.resolved_database_url())
        with sessions() as session:
            run = session.get(Run, run_id)
            assert run is not None, f"run {run_id} does not exist"
            profile = executed_profile(run, profiles)
            arms = list(run.arms)
        engines = engines or vllm_engines(settings)
        return cls(run_id, settings, resolve_profile(profile), worker_id, sessions, engines, arms)

    @property
    def run_dir(self) -> Path:
        return self.settings.runs_dir() / str(self.run_id)

    def owned(self) -> AbstractContextManager[tuple[Session, Run]]:
        """A write transaction on the run's locked row; RunLost (nothing written) when the run is
        no longer active under this worker."""
        return owned_run(self.sessions, self.run_id, self.worker_id)

    def update(self, status: Status | None = None, message: str = "", **fields: Any) -> None:
        """Set fields of the run's row and, with `status`, move it (one owned transaction)."""
        with self.owned() as (session, run):
            for name, value in fields.items():
                setattr(run, name, value)
            if status is not None:
                transition(session, run, status, message)

    def event(self, kind: str, message: str) -> None:
        with self.owned() as (session, _):
            session.add(RunEvent(run_id=self.run_id, kind=kind, message=message))


def refuse(run_id: int, settings: Settings, worker_id: str, exc: Exception) -> str:
    """End a claimed run that cannot execute here (`RunContext.open` raised `exc`) as `error`;
    its final status, or `interrupted` when it is no longer this worker's."""
    message = f"{type(exc).__name__}: {exc}"
    try:
        with owned_run(partial(session_scope, settings.resolved_database_url()), run_id, worker_id) as (session, run):
            run.error = message
            transition(session, run, Status.ERROR, message)
    except RunLost:
        return Status.INTERRUPTED.value
    return Status.ERROR.value
