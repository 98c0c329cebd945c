"""Beside a running attempt: the heartbeat that keeps its claim alive, the cancel flag read into
its stop event, and progress written to the run row.

A heartbeat that finds the run no longer this worker's (`RunLost`) stops the attempt the way a
cancel does, and the pipeline then ends without writing anything more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from service.db.models import Run, utcnow
from service.runs.context import RunContext, RunLost

log = logging.getLogger(__name__)

PROGRESS_WRITE_INTERVAL_S = 1.0


class RunCancelled(RuntimeError):
    pass


@dataclass
class Watcher:
    """Polls the run row every `interval_s`: heartbeat for liveness, and the cancel flag (or a lost
    claim) into `stop_event`, which every arm's engine and suites watch."""

    context: RunContext
    stop_event: threading.Event = field(default_factory=threading.Event)
    interval_s: float = 1.0
    cancelled: threading.Event = field(default_factory=threading.Event)
    lost: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        name = f"run-{self.context.run_id}-watch"
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def rearm(self, arm: str) -> None:
        """A clear stop event for the next arm's engine, unless the run was stopped meanwhile."""
        self.raise_if_stopped(f"before arm {arm} started")
        self.stop_event.clear()
        if self.lost.is_set() or self.cancelled.is_set():  # stopped while it was being cleared
            self.stop_event.set()

    def raise_if_stopped(self, moment: str) -> None:
        """RunLost or RunCancelled when either stopped the attempt."""
        if self.lost.is_set():
            raise RunLost(f"run {self.context.run_id} was taken from this worker {moment}")
        if self.cancelled.is_set():
            raise RunCancelled(f"cancelled {moment}")

    def _loop(self) -> None:
        failing = False
        while not self.done.wait(self.interval_s):
            try:
                self.beat()
            except RunLost:
                self.lose()
                return
            except Exception:  # a dropped connection must not end the heartbeat for good
                if not failing:  # once per outage, not every second
                    log.exception("run %d: heartbeat failed; trying again every second", self.context.run_id)
                failing = True
                continue
            if failing:
                log.warning("run %d: heartbeat written again", self.context.run_id)
            failing = False

    def lose(self) -> None:
        """Stop the attempt of a run that is no longer this worker's."""
        if not self.lost.is_set():
            log.warning("run %d: no longer this worker's; stopping its attempt", self.context.run_id)
        self.lost.set()
        self.stop_event.set()

    def write(self, change: Callable[[Session, Run], None]) -> None:
        """`change` in an owned transaction; a lost run stops the attempt instead of raising into a
        suite's callback (the suite then ends as on a cancel)."""
        if self.lost.is_set():
            return
        try:
            with self.context.owned() as (session, run):
                change(session, run)
        except RunLost:
            self.lose()

    def beat(self) -> None:
        """One heartbeat; RunLost once the run is not this worker's."""
        with self.context.owned() as (_, run):
            run.heartbeat_at = utcnow()
            if run.cancel_requested:
                self.cancelled.set()
                self.stop_event.set()


@dataclass
class Progress:
    """A suite's progress callback: the run row's counters, at most once a second."""

    watcher: Watcher
    phase: str
    last_write: float = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last_write < PROGRESS_WRITE_INTERVAL_S and done < total:
            return
        self.last_write = now
        self.watcher.write(lambda _, run: self._count(run, done, total))

    def _count(self, run: Run, done: int, total: int) -> None:
        if run.progress_phase != self.phase:
            run.phase_started_at = utcnow()
        run.progress_done, run.progress_total, run.progress_phase = done, total, self.phase
