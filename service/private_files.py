"""Everything under KVCANARY_DATA_DIR is the service user's alone: folders 0700, files 0600.

Run folders hold engine logs (with model paths and the engine's environment), receipts,
prompts and answers. The service's own code creates its folders and files with these modes;
what the engine, lm-eval and the suites write is covered by the umask the service's processes
run under (`kvcanary serve`, `kvcanary run`, a Ray node's task, and every engine they start).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600


def keep_private() -> None:
    """Give this process (and every process it starts) a umask that leaves group and others out."""
    os.umask(PRIVATE_UMASK)


def private_dir(path: Path) -> Path:
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return path


def append_private(path: Path) -> IO[bytes]:
    """`path` opened for appending bytes, created 0600 if it is new."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE), "ab")
