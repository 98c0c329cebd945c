"""Kill the engines a Ray worker started when that worker dies without stopping them.

Ray kills a worker process outright when its task is force-cancelled, when the service
replica that dispatched it goes away, or when the worker runs out of memory. A vLLM engine
runs as the leader of its own process group (service.engine.process_group), so it outlives
such a worker and keeps its GPUs. Before a worker force-exits (and when its raylet dies) Ray
also SIGKILLs the worker's direct children: that reaches an engine's leader, the API server,
but not the rest of its group (the engine core and its workers), and it would reach a
watchdog that was a child too. So this watchdog is no child of the worker: its launcher,
in a session of its own, forks it and exits. It remembers every process group the worker
started and kills those groups once the worker is gone; the worker ends it with `stop` on
its stdin when the block ends normally.

Run as `python -m service.runs.orphan_guard <worker pid>`; `OrphanGuard` does that.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from types import TracebackType
from typing import BinaryIO

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


def _told_to_stop(commands: BinaryIO | None, wait_s: float) -> tuple[bool, BinaryIO | None]:
    """Wait up to `wait_s` for `stop` on `commands`; returns (stop, the stream, or None once
    it is closed: a worker that dies closes it too, so the pid decides then)."""
    if commands is None:
        time.sleep(wait_s)
        return False, None
    if not select.select([commands], [], [], wait_s)[0]:
        return False, commands
    line = commands.readline()
    return line.strip() == b"stop", commands if line else None


def watch(parent: int, commands: BinaryIO | None = None, poll_s: float = POLL_S) -> set[int]:
    """Block while `parent` lives and has not sent `stop` on `commands`; once it is gone,
    SIGKILL the groups it left behind and return them.

    Prints `ready` once it watches, so that the parent starts no engine before that.
    """
    watched = _process(parent)
    if watched is None:
        return set()
    groups: set[int] = set()
    print("ready", flush=True)
    while _alive(watched):
        # The launcher was a child of `parent` and led a group of its own: this watchdog's.
        started = groups_led_by_children(parent) - {os.getpgrp()}
        groups = {group for group in groups | started if group_members(group)}
        stop, commands = _told_to_stop(commands, poll_s)
        if stop:
            return set()
    left = {group for group in groups if group_members(group)}
    for group in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    return left


class OrphanGuard:
    """`with OrphanGuard(): ...` watches this process for the duration of the block."""

    def __init__(self) -> None:
        self._launcher: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> OrphanGuard:
        self._launcher = subprocess.Popen(
            [sys.executable, "-m", "service.runs.orphan_guard", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._launcher.stdout is not None
        ready = self._launcher.stdout.readline()
        self._launcher.wait(10)  # the launcher exits as soon as it has forked the watchdog
        if ready != b"ready\n":
            raise RuntimeError(f"the orphan guard exited ({self._launcher.returncode}) before it watched this process")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        """The block ended in this (living) process, so its engines were stopped; the guard may go."""
        if self._launcher is None or self._launcher.stdin is None or self._launcher.stdout is None:
            return
        with contextlib.suppress(BrokenPipeError):  # the watchdog is gone already
            self._launcher.stdin.write(b"stop\n")
            self._launcher.stdin.close()
        # The watchdog holds the other end of stdout until it exits.
        if select.select([self._launcher.stdout], [], [], 10)[0]:
            self._launcher.stdout.read()
        self._launcher.stdout.close()


def _main(parent: int) -> None:
    if os.fork():
        os._exit(0)  # the launcher: its child, the watchdog, is now no child of the worker
    killed = watch(parent, sys.stdin.buffer)
    if killed:
        print(f"orphan guard: {parent} died; killed its engine process groups {sorted(killed)}", file=sys.stderr)


if __name__ == "__main__":
    _main(int(sys.argv[1]))
