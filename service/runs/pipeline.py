"""Execute one claimed run: each arm's engine and suites in turn, then the verdict.

The same function serves the service's worker, `kvcanary run` and the Ray executor, so a
run behaves identically wherever it executes. Each arm of a run (a kernel variant plus engine
overrides: one, or several for an A/B run) runs its suites on an engine (`arm_execution.run_arm`):
consecutive arms whose engine arguments match share one, switched between them, unless the run
asks for fresh engines (`shared_engines`). The
run is a `RunContext`: the profile it executes is the one it stored when it was triggered, and
every write checks that the run is still this worker's (`RunContext.owned`); once it is not,
the attempt ends `interrupted` and writes nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sqlalchemy.orm import Session

from evals.suites.base import SuiteAborted, SuiteOutcome
from service.arms import apply as apply_arm
from service.arms import run_arms
from service.db.models import Run
from service.engine.death import EngineDied
from service.engine.launcher import EngineStartError
from service.private_files import private_dir
from service.profiles import Profile
from service.releases import settled
from service.runs import scoring
from service.runs.arm_execution import LOG_TAIL_CHARS, run_arm
from service.runs.context import EngineFactory, RunContext, RunLost, refuse
from service.runs.shared_engines import ArmEngines
from service.runs.state import Status, transition
from service.runs.watch import RunCancelled, Watcher
from service.settings import Settings

log = logging.getLogger(__name__)


def run_claimed(
    run_id: int,
    settings: Settings,
    profiles: Mapping[str, Profile],
    worker_id: str,
    engines: EngineFactory | None = None,
) -> str:
    """Open the context of a run `worker_id` claimed and execute it; a run that cannot execute
    here (its stored profile no longer validates, this host lacks its GPUs) ends `error`. What is
    computed once from an ended run (a mutation batch's matrix) is computed after its last write."""
    try:
        context = RunContext.open(run_id, settings, profiles, worker_id, engines)
    except Exception as exc:
        return refuse(run_id, settings, worker_id, exc)
    status = execute(context)
    settled.settle(settings.resolved_database_url(), run_id, settings.release_label, settings.release_gate_roles)
    return status


def execute(context: RunContext) -> str:
    """Run a claimed run (status starting_engine) to its end state; returns that state.

    In an A/B run an arm whose engine dies does not stop the other: the surviving arm is
    still judged (against the baseline), and the run ends `error` naming the dead arm.
    """
    watcher = Watcher(context)
    watcher.start()
    try:
        return _execute(context, watcher)
    except RunLost as exc:
        log.warning("%s; this attempt ends without writing more", exc)
        return Status.INTERRUPTED.value
    except RunCancelled as exc:
        return _end(context, Status.CANCELLED, str(exc))
    except EngineDied as exc:
        return _end(context, Status.ERROR, f"EngineDied: {exc}", exc.log_tail)
    except (EngineStartError, SuiteAborted) as exc:
        return _end(context, Status.ERROR, f"{type(exc).__name__}: {exc}", getattr(exc, "log_tail", ""))
    except Exception as exc:
        return _end(context, Status.ERROR, f"{type(exc).__name__}: {exc}")
    finally:
        watcher.done.set()


def _execute(context: RunContext, watcher: Watcher) -> str:
    private_dir(context.run_dir)
    context.update(run_dir=str(context.run_dir))
    specs = run_arms(context.arms, context.profile)
    arms = [spec.name for spec in specs]
    outcomes: dict[tuple[str, str], SuiteOutcome] = {}
    deaths: list[EngineDied] = []
    engines = ArmEngines(
        [(spec.name, apply_arm(context.profile, spec)) for spec in specs],
        context.engines,
        context.run_dir,
        watcher.stop_event,
        context.event,
    )
    try:
        for arm in arms:
            try:
                run_arm(context, engines, arm, arms[0] if arm != arms[0] else None, watcher, outcomes)
            except EngineDied as death:
                if len(arms) == 1:
                    raise
                deaths.append(death)
                context.event("arm_error", str(death))
                context.update(log_tail=death.log_tail[-LOG_TAIL_CHARS:], timings=dict(context.timings))
    finally:
        engines.close()
    if len(deaths) == len(arms):
        raise deaths[0]
    context.update(Status.SCORING, "suites done", timings=dict(context.timings), engine_pid=None)
    with context.owned() as (session, run):  # verdict and end in one transaction
        verdict, summary = scoring.score(session, run, context.profile, outcomes, arms)
        scoring.judge_arms(session, run, arms, [death.arm for death in deaths])
        run.verdict, run.verdict_summary = verdict, summary
        if deaths:
            message = "EngineDied: " + "; ".join(str(death) for death in deaths)
            return _finish(context, session, run, Status.ERROR, message, deaths[0].log_tail)
        final = Status.FAILED if verdict == "fail" else Status.PASSED
        transition(session, run, final, summary)
        return final.value


def _end(context: RunContext, status: Status, message: str, tail: str = "") -> str:
    """Write the run's end (`interrupted` instead, with nothing written, if it is no longer ours)."""
    try:
        with context.owned() as (session, run):
            return _finish(context, session, run, status, message, tail)
    except RunLost as exc:
        log.warning("%s; its end (%s) is not written", exc, status.value)
        return Status.INTERRUPTED.value


def _finish(context: RunContext, session: Session, run: Run, status: Status, message: str, tail: str) -> str:
    tail = tail or context.log_tail
    run.error = message if status == Status.ERROR else ""
    run.timings = dict(context.timings)
    if tail:
        run.log_tail = tail[-LOG_TAIL_CHARS:]
    transition(session, run, status, message)
    return status.value
