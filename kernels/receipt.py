"""Injection receipts: one JSON file per vLLM process, saying what the plugin did there.

A run's record must prove which kernels served it, so every vLLM process the plugin loads in
writes its own file into the run's receipt folder, and the launcher reads them all back.
Files are replaced atomically (temp file + rename), so a reader never sees half a receipt
even while a process rewrites its receipt as hooks fire.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

PREFIX = "receipt-"
SUFFIX = ".json"


def receipt_path(directory: Path, pid: int) -> Path:
    return directory / f"{PREFIX}{pid}{SUFFIX}"


def write_receipt(directory: Path, receipt: dict[str, Any]) -> Path:
    """Write (or replace) the receipt of process `receipt["pid"]` (default: this process)."""
    pid = int(receipt.get("pid", os.getpid()))
    directory.mkdir(parents=True, exist_ok=True)
    target = receipt_path(directory, pid)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{PREFIX}{pid}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(receipt, handle, indent=2, sort_keys=True, default=str)
            handle.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_receipts(directory: Path) -> list[dict[str, Any]]:
    """Every receipt in `directory`, ordered by pid; an absent folder holds none."""
    if not directory.is_dir():
        return []
    receipts: list[dict[str, Any]] = []
    for path in directory.glob(f"{PREFIX}*{SUFFIX}"):
        try:
            receipt = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"injection receipt {path} is not valid JSON ({exc}); it was not written "
                "by kernels.receipt.write_receipt: remove it and rerun"
            ) from exc
        if not isinstance(receipt, dict):
            raise ValueError(f"injection receipt {path} holds a {type(receipt).__name__}, not an object")
        receipts.append(receipt)
    return sorted(receipts, key=lambda r: int(r.get("pid", 0)))
