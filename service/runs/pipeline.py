"""Execute one claimed run: engine up, suites against it, samples stored as they come, verdict.

The same function serves the service's worker, `kvcanary run` and the Ray executor, so a
run behaves identically wherever it executes. Each arm of a run (a kernel variant plus engine
overrides: one, or several for an A/B run) has its own engine, started from the profile with
the arm's overrides in place; suites of an arm share that engine. The profile is the one the
run stored when it was triggered (`service.runs.admission.executed_profile`), not the YAML as
it reads now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from evals import fixtures
from evals import suites as suite_registry
from evals.suites.base import Sample, SuiteAborted, SuiteContext, SuiteOutcome
from service.arms import apply as apply_arm
from service.arms import run_arms
from service.db.models import Run, RunEvent, utcnow
from service.db.session import session_scope
from service.engine.death import EngineDied, diagnose_file
from service.engine.launcher import Engine, EngineStartError
from service.private_files import private_dir
from service.profiles import Profile
from service.runs import scoring, store
from service.runs.admission import executed_profile
from service.runs.state import Status, transition
from service.settings import Settings

log = logging.getLogger(__name__)

PROGRESS_WRITE_INTERVAL_S = 1.0
LOG_TAIL_CHARS = 20_000


class RunCancelled(RuntimeError):
    pass


@dataclass
class _Watcher:
    """Polls the run row: heartbeat for liveness, and the cancel flag into the stop event."""

    url: str
    run_id: int
    stop_event: threading.Event
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._loop, name=f"run-{self.run_id}-watch", daemon=True).start()

    def _loop(self) -> None:
        failing = False
        while not self.done.wait(1.0):
            try:
                if not self._beat():
                    return
            except Exception:  # a dropped connection must not end the heartbeat for good
                if not failing:  # once per outage, not every second
                    log.exception("run %d: heartbeat failed; trying again every second", self.run_id)
                failing = True
                continue
            if failing:
                log.warning("run %d: heartbeat written again", self.run_id)
            failing = False

    def _beat(self) -> bool:
        """One heartbeat; False once the run row is gone."""
        with session_scope(self.url) as session:
            run = session.get(Run, self.run_id)
            if run is None:
                return False
            run.heartbeat_at = utcnow()
            if run.cancel_requested:
                self.cancelled.set()
                self.stop_event.set()
        return True


@dataclass
class _Progress:
    url: str
    run_id: int
    phase: str
    began: float = field(default_factory=time.monotonic)
    last_write: float = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last_write < PROGRESS_WRITE_INTERVAL_S and done < total:
            return
        self.last_write = now
        with session_scope(self.url) as session:
            run = session.get(Run, self.run_id)
            if run is not None:
                if run.progress_phase != self.phase:
                    run.phase_started_at = utcnow()
                run.progress_done, run.progress_total, run.progress_phase = done, total, self.phase


def _event(url: str, run_id: int, kind: str, message: str) -> None:
    with session_scope(url) as session:
        session.add(RunEvent(run_id=run_id, kind=kind, message=message))


def _set(url: str, run_id: int, status: Status | None = None, message: str = "", **fields: Any) -> None:
    with session_scope(url) as session:
        run = session.get(Run, run_id)
        assert run is not None, f"run {run_id} vanished"
        for name, value in fields.items():
            setattr(run, name, value)
        if status is not None:
            transition(session, run, status, message)


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


def _compared_with(
    session: Session, run: Run, control_arm: str | None, profile: Profile, suite: str, metric: str
) -> dict[str, Sample]:
    """What this arm's outputs are compared with: the control arm's samples in an A/B run, else
    the promoted reference run's (none for the control arm itself or without a reference)."""
    if control_arm is not None:
        return store.load_samples(session, run.id, control_arm, suite)
    if len(run.arms) > 1:
        return {}
    _, reference_run = scoring.baseline_for(session, profile.name, suite, metric)
    found = scoring.reference_samples(session, reference_run, suite) if reference_run != run.id else None
    return found or {}


def _run_suite(
    url: str,
    run: Run,
    arm: str,
    control_arm: str | None,
    profile: Profile,
    engine: Engine,
    suite: str,
    work_dir: Path,
) -> SuiteOutcome:
    definition = suite_registry.get(suite)
    config = profile.suite_configs()[suite]
    primary = definition.metric_names(config)[0]
    with session_scope(url) as session:
        done = store.load_samples(session, run.id, arm, suite)
        compared_with = (
            _compared_with(session, run, control_arm, profile, suite, primary) if definition.compares_outputs else {}
        )

    def emit(samples: Sequence[Sample]) -> None:
        with session_scope(url) as session:
            store.save_samples(session, run.id, arm, suite, primary, samples)

    private_dir(work_dir)
    context = SuiteContext(
        server_url=engine.url,
        served_model_name=profile.served_model_name,
        model_path=profile.model,
        config=config,
        work_dir=work_dir,
        progress=_Progress(url, run.id, f"{arm}/{suite}" if len(run.arms) > 1 else suite),
        emit_samples=emit,
        done_samples=done,
        reference_samples=compared_with,
        stop_event=engine.stop_event,
    )
    if done:
        _event(url, run.id, "resume", f"{arm}/{suite}: reusing {len(done)} samples stored by an earlier attempt")
    outcome = definition.run(context)
    # An earlier attempt's samples of items this one does not have (its profile or the engine's
    # block size changed in between) must not be scored with this attempt's.
    stale = set(done) - {s.key for s in outcome.samples}
    if stale:
        with session_scope(url) as session:
            store.drop_samples(session, run.id, arm, suite, stale)
        _event(url, run.id, "resume", f"{arm}/{suite}: dropped {len(stale)} samples of items this attempt did not have")
    return outcome


def _engine_facts(engine: Engine) -> dict[str, Any]:
    receipts = engine.receipts()
    return {
        "version": engine.version,
        "models": engine.models,
        "url": engine.url,
        "startup_s": engine.startup_s,
        "receipts": receipts,
        "gpu": next((r["device"] for r in receipts if r.get("runs_model") and r.get("device")), None),
    }


def _check_receipts(profile: Profile, facts: dict[str, Any]) -> None:
    """On a GPU, asking for injection and getting no worker receipt is a broken run, not a pass."""
    if profile.kernels.variant == "stock" and not profile.kernels.canaries:
        return
    receipts = facts["receipts"]
    on_gpu = any(r.get("platform") in {"cuda", "rocm"} for r in receipts)
    if on_gpu and not any(r.get("runs_model") for r in receipts):
        raise EngineStartError(
            "kernel injection was asked for but no process that runs the model wrote a receipt; "
            "the plugin did not load where the model runs",
            exit_code=None,
            log_tail="",
        )


def _arm_died(url: str, run_id: int, engine: Engine, arm: str, moment: str, symptom: str) -> EngineDied:
    """The one error an engine death becomes, wherever it was noticed; the log names the cause."""
    with session_scope(url) as session:
        run = session.get(Run, run_id)
        if run is not None and run.progress_total:
            moment += f" ({run.progress_done} of {run.progress_total} items done)"
    return EngineDied(
        arm=arm, moment=moment, symptom=symptom, cause=diagnose_file(engine.log_path), log_tail=engine.log_tail()
    )


def _start_arm(url: str, run: Run, arm: str, engine: Engine) -> None:
    try:
        engine.start()
    except EngineStartError as exc:
        if exc.exit_code is None:
            raise  # alive but not healthy in time, or no receipt: not a death
        symptom = str(exc).splitlines()[0]
        raise _arm_died(url, run.id, engine, arm, "at start-up, before /health answered", symptom) from None


def _run_arm(
    url: str,
    run: Run,
    arm: str,
    control: str | None,
    arm_profile: Profile,
    engine: Engine,
    arm_dir: Path,
    watcher: _Watcher,
    timings: dict[str, Any],
    outcomes: dict[tuple[str, str], SuiteOutcome],
) -> None:
    """Every suite of one arm against its engine; an engine death raises EngineDied."""
    for entry in arm_profile.suites:
        began = time.monotonic()
        moment = f"while {entry.suite} ran"
        try:
            outcome = _run_suite(url, run, arm, control, arm_profile, engine, entry.suite, arm_dir / entry.suite)
        except Exception as exc:
            if watcher.cancelled.is_set():
                raise RunCancelled("cancelled while suites ran") from None
            symptom = engine.death_symptom()
            if symptom is None and isinstance(exc, SuiteAborted):
                symptom = str(exc)
            if symptom is None:
                raise
            raise _arm_died(url, run.id, engine, arm, moment, symptom) from None
        if watcher.cancelled.is_set():
            raise RunCancelled("cancelled while suites ran")
        symptom = engine.death_symptom() if engine.stop_event.is_set() else None
        if symptom is not None:
            raise _arm_died(url, run.id, engine, arm, moment, symptom)
        outcomes[(arm, entry.suite)] = outcome
        timings[f"{arm}.{entry.suite}_s"] = round(time.monotonic() - began, 2)
        _set(url, run.id, timings=dict(timings))


def execute(run_id: int, settings: Settings, profiles: dict[str, Profile], worker_id: str = "local") -> str:
    """Run a claimed run (status starting_engine) to its end state; returns that state.

    In an A/B run an arm whose engine dies does not stop the other: the surviving arm is
    still judged (against the baseline), and the run ends `error` naming the dead arm.
    """
    url = settings.resolved_database_url()
    with session_scope(url) as session:
        run = session.get(Run, run_id)
        assert run is not None, f"run {run_id} does not exist"
        session.expunge(run)
    run_dir = settings.runs_dir() / str(run.id)
    private_dir(run_dir)
    stop_event = threading.Event()
    watcher = _Watcher(url, run.id, stop_event)
    watcher.start()
    engine: Engine | None = None
    timings: dict[str, Any] = {}
    try:
        profile = resolve_profile(executed_profile(run, profiles))
        _set(url, run.id, run_dir=str(run_dir))
        specs = run_arms(run.arms, profile)
        arms = [spec.name for spec in specs]
        outcomes: dict[tuple[str, str], SuiteOutcome] = {}
        deaths: list[EngineDied] = []
        running = False
        for spec in specs:
            arm, arm_profile = spec.name, apply_arm(profile, spec)
            stop_event.clear()
            engine = Engine(arm_profile, run_dir / arm, python=settings.engine_python, stop_event=stop_event)
            private_dir(run_dir / arm)
            began = time.monotonic()
            try:
                _start_arm(url, run, arm, engine)
                _set(url, run.id, engine_pid=engine.pid)
                facts = _engine_facts(engine)
                _check_receipts(arm_profile, facts)
                timings[f"{arm}.engine_start_s"] = round(time.monotonic() - began, 2)
                engine_record = dict(run.engine)
                engine_record[arm] = facts
                run.engine = engine_record
                if not running:
                    running = True
                    _set(url, run.id, Status.RUNNING, f"engine {facts['version']} up", engine=engine_record)
                else:
                    _set(url, run.id, engine=engine_record)
                control = arms[0] if arm != arms[0] else None
                _run_arm(url, run, arm, control, arm_profile, engine, run_dir / arm, watcher, timings, outcomes)
            except EngineDied as death:
                if len(arms) == 1:
                    raise
                deaths.append(death)
                _event(url, run.id, "arm_error", str(death))
                _set(url, run.id, log_tail=death.log_tail[-LOG_TAIL_CHARS:], timings=dict(timings))
                engine.stop()
                engine = None
                continue
            _set(url, run.id, log_tail=engine.log_tail()[-LOG_TAIL_CHARS:])
            engine.stop()
            engine = None
        if len(deaths) == len(arms):
            raise deaths[0]
        _set(url, run.id, Status.SCORING, "suites done", timings=dict(timings), engine_pid=None)
        verdict, summary = scoring.score(url, run.id, profile, outcomes, arms)
        scoring.judge_arms(url, run.id, arms, [death.arm for death in deaths])
        if deaths:
            message = "EngineDied: " + "; ".join(str(death) for death in deaths)
            _set(url, run.id, verdict=verdict, verdict_summary=summary)
            return _end(url, run.id, Status.ERROR, message, None, timings, deaths[0].log_tail)
        final = Status.FAILED if verdict == "fail" else Status.PASSED
        _set(url, run.id, final, summary, verdict=verdict, verdict_summary=summary)
        return final.value
    except RunCancelled as exc:
        return _end(url, run.id, Status.CANCELLED, str(exc), engine, timings)
    except EngineDied as exc:
        return _end(url, run.id, Status.ERROR, f"EngineDied: {exc}", engine, timings, exc.log_tail)
    except (EngineStartError, SuiteAborted) as exc:
        tail = getattr(exc, "log_tail", "") or (engine.log_tail() if engine else "")
        return _end(url, run.id, Status.ERROR, f"{type(exc).__name__}: {exc}", engine, timings, tail)
    except Exception as exc:
        return _end(url, run.id, Status.ERROR, f"{type(exc).__name__}: {exc}", engine, timings)
    finally:
        watcher.done.set()
        if engine is not None:
            engine.stop()


def _end(
    url: str,
    run_id: int,
    status: Status,
    message: str,
    engine: Engine | None,
    timings: dict[str, Any],
    tail: str | None = None,
) -> str:
    if engine is not None:
        engine.stop()
        tail = tail or engine.log_tail()
    fields: dict[str, Any] = {"error": message if status == Status.ERROR else "", "timings": dict(timings)}
    if tail:
        fields["log_tail"] = tail[-LOG_TAIL_CHARS:]
    _set(url, run_id, status, message, **fields)
    return status.value
