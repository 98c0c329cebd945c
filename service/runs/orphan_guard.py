"""Kill the engines a Ray worker started when that worker dies without stopping them.

Ray kills a worker process outright when its task is force-cancelled, when the service
replica that dispatched it goes away, or when the worker runs out of memory. A vLLM engine
runs as the leader of its own process group (service.engine.process_group), so it outlives
such a worker and keeps its GPUs; Ray only kills the worker's direct children, not their
helpers. This watchdog runs beside the task in a session of its own, remembers every process
group the worker started, and kills those groups once the worker is gone.

Run as `python -m service.runs.orphan_guard <worker pid>`; `OrphanGuard` does that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from types import TracebackType

import psutil

from service.engine.process_group import group_members

POLL_S = 0.5


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _alive(process: psutil.Process) -> bool:
    """The process is still the one we watch (psutil compares start times: pids get reused), not a zombie."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def groups_led_by_children(parent: int) -> set[int]:
    """Process groups whose leader is a child of `parent`: the engines it started."""
    found = _process(parent)
    if found is None:
        return set()
    groups = set()
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in found.children():
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(child.pid) == child.pid:
                    groups.add(child.pid)
    return groups


def watch(parent: int, poll_s: float = POLL_S) -> set[int]:
    """Block while `parent` lives; then SIGKILL the groups it left behind and return them.

    Prints `ready` once it watches, so that the parent starts no engine before that.
    """
    watched = _process(parent)
    if watched is None:
        return set()
    groups: set[int] = set()
    print("ready", flush=True)
    while _alive(watched):
        started = groups_led_by_children(parent) - {os.getpid()}
        groups = {group for group in groups | started if group_members(group)}
        time.sleep(poll_s)
    left = {group for group in groups if group_members(group)}
    for group in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    return left


class OrphanGuard:
    """`with OrphanGuard(): ...` watches this process for the duration of the block."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> OrphanGuard:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "service.runs.orphan_guard", str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._process.stdout is not None
        if self._process.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the orphan guard exited ({self._process.wait()}) before it watched this process")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        """The block ended in this (living) process, so its engines were stopped; the guard may go."""
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
            if self._process.stdout is not None:
                self._process.stdout.close()


if __name__ == "__main__":
    killed = watch(int(sys.argv[1]))
    if killed:
        print(f"orphan guard: {sys.argv[1]} died; killed its engine process groups {sorted(killed)}", file=sys.stderr)
