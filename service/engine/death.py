"""One way to say that an engine died: which arm, when, and the cause read from its log.

A dead engine shows up in many places: the health watch sees a 503 or an exit, lm-eval sees a
refused connection, the WER client a reset, the launcher an exit before /health. Each of
those says only that the engine is gone. The cause is in the engine's log, often far above
the last lines: a CUDA error (reported asynchronously, so the call that raised it is usually
not the kernel that faulted), an out-of-memory error, or a Python exception. `diagnose` reads
it from there in one line, and `EngineDied` carries it with the tail beside it.
"""

from __future__ import annotations

import re
from pathlib import Path

from service.engine.launcher import read_tail

# Enough of the log to reach the first error line above vLLM's shutdown chatter.
DIAGNOSE_LINES = 4000
CUDA_ASYNC_NOTE = (
    "CUDA reports kernel faults asynchronously, so the call that raised it is not necessarily the faulty kernel"
)

# (pattern, what it means); the first pattern found anywhere in the log wins, in this order.
_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(CUDA error: an illegal memory access was encountered)"), "cuda"),
    (re.compile(r"(CUDA error: [^\n]*)"), "cuda"),
    (re.compile(r"(CUBLAS_STATUS_[A-Z_]+[^\n]*)"), "cuda"),
    (re.compile(r"(CUDA out of memory[^\n]*)"), "oom"),
    (re.compile(r"(torch\.OutOfMemoryError[^\n]*)"), "oom"),
    (re.compile(r"(RuntimeError: Triton Error \[CUDA\][^\n]*)"), "cuda"),
)
_EXCEPTION = re.compile(r"^(?:\S+ )*?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)\b: .+)$", re.MULTILINE)
_NOISE = ("EngineDeadError", "EngineGenerateError", "Engine core proc", "CancelledError", "Traceback")


def diagnose(log_text: str) -> str | None:
    """The cause of death in one line, from the engine's log; None if the log names none."""
    for pattern, kind in _CAUSES:
        found = pattern.search(log_text)
        if found:
            line = _clean(found.group(1))
            if kind == "cuda":
                return f"CUDA error: {line.removeprefix('CUDA error: ')} ({CUDA_ASYNC_NOTE})"
            return f"out of GPU memory: {line}"
    exceptions = [_clean(m.group(1)) for m in _EXCEPTION.finditer(log_text)]
    meaningful = [e for e in exceptions if not any(noise in e for noise in _NOISE)]
    if meaningful:
        return f"Python exception in the engine: {meaningful[0]}"
    return None


def diagnose_file(log_path: Path) -> str | None:
    """`diagnose` on the last `DIAGNOSE_LINES` lines of a log file."""
    return diagnose(read_tail(log_path, DIAGNOSE_LINES))


def _clean(line: str) -> str:
    line = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
    return line if len(line) <= 300 else line[:297] + "..."


class EngineDied(RuntimeError):
    """The engine of one arm died (at start-up or under the suites); the message is one line."""

    def __init__(self, *, arm: str, moment: str, symptom: str, cause: str | None, log_tail: str) -> None:
        because = cause or f"its log names no cause ({symptom})"
        super().__init__(f"the engine of arm {arm!r} died {moment}: {because}")
        self.arm = arm
        self.symptom = symptom
        self.cause = cause
        self.log_tail = log_tail
