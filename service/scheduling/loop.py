"""The scheduler: a thread in `kvcanary serve` that fires schedules when they fall due.

Every service process on a database runs one; the `ScheduleFire` unique key, not any
leader election, makes each fire happen once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from service.db.models import utcnow
from service.profiles import Profile
from service.scheduling import schedules
from service.settings import Settings

log = logging.getLogger(__name__)

MIN_PAUSE_S = 0.01


class Scheduler:
    """`clock` says what time it is; tests pass one they move, and call `sync` and `tick` themselves."""

    def __init__(self, settings: Settings, profiles: dict[str, Profile], clock: schedules.Clock = utcnow) -> None:
        self.settings = settings
        self.profiles = profiles
        self.clock = clock
        self.url = settings.resolved_database_url()
        self.process = f"{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvcanary-scheduler", daemon=True)

    def sync(self) -> None:
        """Bring the schedule rows in line with the profiles' schedule blocks."""
        schedules.sync_from_profiles(self.url, self.profiles, self.settings.nightly, self.clock)

    def start(self) -> None:
        """Sync the profiles' schedule blocks (errors surface here, at service start), then tick."""
        self.sync()
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def tick(self) -> list[schedules.Fired]:
        fired = schedules.fire_due(self.url, self.profiles, f"schedule ({self.process})", self.clock)
        for f in fired:
            if f.run_id is not None:
                log.info("schedule %s fired for %s: run %d queued", f.schedule, f.fire_time.isoformat(), f.run_id)
            else:
                log.warning("schedule %s fired for %s: %s", f.schedule, f.fire_time.isoformat(), f.skipped_reason)
        return fired

    def _pause(self) -> float:
        """Until the next tick, or the next fire time if sooner: fires happen on time, not a tick late.

        The tick still bounds the pause, so schedules changed by another process or the API are seen.
        """
        tick = self.settings.scheduler_tick_s
        upcoming = schedules.earliest_next_fire(self.url)
        if upcoming is None:
            return tick
        return min(tick, max(MIN_PAUSE_S, (upcoming - self.clock()).total_seconds()))

    def _loop(self) -> None:
        while not self._stop.is_set():
            pause = self.settings.scheduler_tick_s
            try:
                self.tick()
                pause = self._pause()
            except Exception:
                log.exception("scheduler tick failed; trying again next tick")
            self._stop.wait(pause)
