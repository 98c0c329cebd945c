"""Start a command as the leader of its own process group, and stop the whole group.

vLLM's API server forks helpers (the engine core, tensor-parallel workers, compile
workers). Signalling only the server's pid can leave them running and holding memory or a
GPU, and killing the server with -9 orphans them; every signal therefore goes to the group
the server leads, and stopping waits until no live member of that group remains.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from service.private_files import PRIVATE_UMASK, append_private

_POLL_S = 0.2
_AFTER_KILL_WAIT_S = 10.0


class ProcessGroupError(RuntimeError):
    """Members of a stopped group survived SIGKILL (stuck in the kernel, e.g. a hung GPU driver)."""


def start_group(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `argv` (never a shell) in a new session, appending stdout and stderr to `log_path`.

    The log is created 0600 and the process runs under a private umask, so what it writes in the
    run folder (receipts, caches) is the service user's alone whatever this process's umask is.
    """
    with append_private(log_path) as log:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            umask=PRIVATE_UMASK,
        )


def group_members(pgid: int) -> list[int]:
    """Pids of live processes in group `pgid`.

    Zombies are left out: they hold no memory and cannot be signalled, and where PID 1 does
    not reap orphans (some containers) they would otherwise count as alive forever.
    """
    members = []
    for process in psutil.process_iter():
        # The process may end while we look; then it is no member.
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
    return members


def describe_exit(returncode: int) -> str:
    """'exited with code 1' or 'was killed by SIGKILL' for a Popen return code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (exit code {returncode})"
    return f"exited with code {returncode}"


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # nobody left in the group
        os.killpg(pgid, signum)


def _wait_group_gone(process: subprocess.Popen[bytes], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        process.poll()  # reap the leader so it does not linger as a zombie
        if process.returncode is not None and not group_members(process.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def stop_group(process: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM the group, wait `grace_s`, then SIGKILL it; return the leader's exit code.

    Returns only once no live member of the group remains, or raises ProcessGroupError.
    """
    pgid = process.pid  # start_new_session made the leader's pid the group id
    _signal_group(pgid, signal.SIGTERM)
    if not _wait_group_gone(process, grace_s):
        _signal_group(pgid, signal.SIGKILL)
        if not _wait_group_gone(process, _AFTER_KILL_WAIT_S):
            raise ProcessGroupError(
                f"processes {group_members(pgid)} of group {pgid} are still alive "
                f"{_AFTER_KILL_WAIT_S:.0f} s after SIGKILL; check them with `ps -o pid,stat,cmd -g {pgid}`"
            )
    return process.wait()  # already reaped: returns at once
