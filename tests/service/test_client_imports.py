"""The client (a bare `pip install kvcanary`) imports without the server's packages.

The slow tier installs the wheel into a fresh venv (tests/service/test_install.py); this is the
quick check of the same promise: `service.cli` and what it imports must not reach numpy,
SQLAlchemy, FastAPI or an engine package at import time.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.service.test_install import BLOCKER, ROOT

SERVER_PACKAGES = ("numpy", "sqlalchemy", "alembic", "fastapi", "torch", "triton", "vllm", "lm_eval", "transformers")


def test_the_cli_imports_without_the_server_packages() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER, ",".join(SERVER_PACKAGES), "service.cli", "service.report"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, f"the client imports a server package:\n{result.stdout}{result.stderr}"
