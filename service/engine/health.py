"""Watch a running engine while suites use it, and raise the run's stop flag when it dies.

vLLM answers `GET /health` with 503 once its engine core is dead, while the API process may
stay up; a crashed server simply exits. Either way the suites should stop at once and keep
the samples they finished, so the watch sets the `threading.Event` that suites poll
(`SuiteContext.stop_event`) and records why.
"""

from __future__ import annotations

import subprocess
import threading

import httpx

from service.engine.process_group import describe_exit


class HealthWatch:
    """A daemon thread polling the process and `/health`; `cause` says why it raised the flag.

    A refused or timed-out probe is only counted: a 2-core host under 64 concurrent requests
    can be slow to answer, so the watch waits for `unreachable_limit` failures in a row. Any
    answer other than 200, or the process exiting, stops the run at the first sighting.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        base_url: str,
        stop_event: threading.Event,
        *,
        interval_s: float = 2.0,
        request_timeout_s: float = 10.0,
        unreachable_limit: int = 3,
    ) -> None:
        self.cause: str | None = None
        self._process = process
        self._health_url = f"{base_url}/health"
        self._stop_event = stop_event
        self._interval_s = interval_s
        self._request_timeout_s = request_timeout_s
        self._unreachable_limit = unreachable_limit
        self._unreachable = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-health-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def halt(self) -> None:
        """End the watch without touching the stop flag (the engine is being stopped on purpose)."""
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        with httpx.Client(timeout=self._request_timeout_s) as client:
            while not self._halt.wait(self._interval_s):
                cause = self._check(client)
                if cause is not None and not self._halt.is_set():
                    self.cause = cause
                    self._stop_event.set()
                    return

    def _check(self, client: httpx.Client) -> str | None:
        returncode = self._process.poll()
        if returncode is not None:
            return f"engine process {self._process.pid} {describe_exit(returncode)}"
        try:
            status = client.get(self._health_url).status_code
        except httpx.HTTPError as exc:
            self._unreachable += 1
            if self._unreachable >= self._unreachable_limit:
                return f"{self._health_url} did not answer {self._unreachable} times in a row: {exc!r}"
            return None
        self._unreachable = 0
        if status == 200:
            return None
        if status == 503:
            return f"engine dead: {self._health_url} answered 503"
        return f"{self._health_url} answered HTTP {status}"
