"""One arm of a run: its engine (started from the profile with the arm's overrides in place, or
the arm before it's engine switched to this arm), every suite of the profile against it, samples
stored as they come; an engine death is `EngineDied`.

An arm's engine comes from `shared_engines.ArmEngines` over the context's factory
(`RunContext.engines`: vLLM, or a stand-in in tests about orchestration). It is stopped when the
arm ends other than by finishing its suites; a finished arm leaves it to the next arm.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from evals import suites as suite_registry
from evals.records import Sample
from evals.suites.base import SuiteAborted, SuiteContext, SuiteOutcome
from service.arms import engine_change
from service.db.models import Run
from service.engine.death import EngineDied, diagnose_file
from service.engine.launcher import EngineStartError
from service.private_files import private_dir
from service.profiles import ArmSpec, Profile
from service.runs import scoring, store
from service.runs.context import ArmEngine, RunContext
from service.runs.shared_engines import ArmEngines
from service.runs.state import Status, transition
from service.runs.watch import Progress, Watcher

LOG_TAIL_CHARS = 20_000


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
    context: RunContext, watcher: Watcher, arm: str, control_arm: str | None, profile: Profile, engine: ArmEngine,
    suite: str, change: dict[str, list[Any]] | None,
) -> SuiteOutcome:  # fmt: skip
    definition = suite_registry.get(suite)
    config = profile.suite_configs()[suite]
    primary = definition.metric_names(config)[0]
    with context.sessions() as session:
        run = session.get(Run, context.run_id)
        assert run is not None, f"run {context.run_id} vanished"
        done = store.load_samples(session, run.id, arm, suite)
        compared_with = (
            _compared_with(session, run, control_arm, profile, suite, primary) if definition.compares_outputs else {}
        )

    def emit(samples: Sequence[Sample]) -> None:
        watcher.write(lambda session, run: store.save_samples(session, run.id, arm, suite, primary, samples))

    work_dir = context.run_dir / arm / suite
    private_dir(work_dir)
    suite_context = SuiteContext(
        server_url=engine.url,
        served_model_name=profile.served_model_name,
        model_path=profile.model,
        config=config,
        work_dir=work_dir,
        progress=Progress(watcher, f"{arm}/{suite}" if len(context.arms) > 1 else suite),
        emit_samples=emit,
        done_samples=done,
        reference_samples=compared_with,
        engine_change=change if control_arm is not None else None,
        stop_event=engine.stop_event,
    )
    if done:
        context.event("resume", f"{arm}/{suite}: reusing {len(done)} samples stored by an earlier attempt")
    outcome = definition.run(suite_context)
    # An earlier attempt's samples of items this one does not have (its profile or the engine's
    # block size changed in between) must not be scored with this attempt's.
    stale = set(done) - {s.key for s in outcome.samples}
    if stale:
        with context.owned() as (session, run):
            store.drop_samples(session, run.id, arm, suite, stale)
        context.event("resume", f"{arm}/{suite}: dropped {len(stale)} samples of items this attempt did not have")
    return outcome


def _engine_facts(engine: ArmEngine) -> dict[str, Any]:
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


def _died(context: RunContext, engine: ArmEngine, arm: str, moment: str, symptom: str) -> EngineDied:
    """The one error an engine death becomes, wherever it was noticed; the log names the cause."""
    with context.sessions() as session:
        run = session.get(Run, context.run_id)
        if run is not None and run.progress_total:
            moment += f" ({run.progress_done} of {run.progress_total} items done)"
    cause = diagnose_file(engine.log_path)
    return EngineDied(arm=arm, moment=moment, symptom=symptom, cause=cause, log_tail=engine.log_tail())


def _start(context: RunContext, arm: str, profile: Profile, engine: ArmEngine, use: dict[str, Any]) -> None:
    """Start the arm's engine (a shared one is up already: `use` holds its switch) and record it on
    the run; the first arm up moves the run to running."""
    began = time.monotonic()
    if "switch" not in use:
        try:
            engine.start()
        except EngineStartError as exc:
            if exc.exit_code is None:
                raise  # alive but not healthy in time, or no receipt: not a death
            symptom = str(exc).splitlines()[0]
            raise _died(context, engine, arm, "at start-up, before /health answered", symptom) from None
        context.timings[f"{arm}.engine_start_s"] = round(time.monotonic() - began, 2)
    facts = {**_engine_facts(engine), "engine_use": use}
    if "switch" in use:
        facts["startup_s"] = None  # this arm started no engine
    with context.owned() as (session, run):
        run.engine_pid = engine.pid
    _check_receipts(profile, facts)
    with context.owned() as (session, run):
        run.engine = {**run.engine, arm: facts}
        if run.status == Status.STARTING_ENGINE.value:
            transition(session, run, Status.RUNNING, f"engine {facts['version']} up")


def run_arm(
    context: RunContext,
    engines: ArmEngines,
    arm: str,
    control: str | None,
    watcher: Watcher,
    outcomes: dict[tuple[str, str], SuiteOutcome],
) -> None:
    """Every suite of one arm against its engine, each outcome into `outcomes` as it ends;
    EngineDied when the engine dies, RunCancelled or RunLost when the watcher stopped the run."""
    profile = engines.profile(arm)
    change = (
        engine_change(context.profile, ArmSpec.model_validate(arm), ArmSpec.model_validate(control))
        if control is not None
        else None
    )
    watcher.rearm(arm)
    private_dir(context.run_dir / arm)
    began = time.monotonic()
    engine, use = engines.take(arm)
    if "switch" in use:
        context.timings[f"{arm}.engine_switch_s"] = round(time.monotonic() - began, 2)
    finished = False
    try:
        _start(context, arm, profile, engine, use)
        for entry in profile.suites:
            began = time.monotonic()
            moment = f"while {entry.suite} ran"
            try:
                outcome = _run_suite(context, watcher, arm, control, profile, engine, entry.suite, change)
            except Exception as exc:
                watcher.raise_if_stopped("while suites ran")
                symptom = engine.death_symptom()
                if symptom is None and isinstance(exc, SuiteAborted):
                    symptom = str(exc)
                if symptom is None:
                    raise
                raise _died(context, engine, arm, moment, symptom) from None
            watcher.raise_if_stopped("while suites ran")
            symptom = engine.death_symptom() if engine.stop_event.is_set() else None
            if symptom is not None:
                raise _died(context, engine, arm, moment, symptom)
            outcomes[(arm, entry.suite)] = outcome
            context.timings[f"{arm}.{entry.suite}_s"] = round(time.monotonic() - began, 2)
            context.update(timings=dict(context.timings))
        finished = True
    finally:
        if not finished:
            engines.close()  # died, cancelled or lost: no later arm may use it
        context.log_tail = engine.log_tail()[-LOG_TAIL_CHARS:]
    context.update(log_tail=context.log_tail)
