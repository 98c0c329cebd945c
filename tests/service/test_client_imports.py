"""The client (a bare `pip install kvcanary`) imports without the server's packages.

The slow tier installs the wheel into a fresh venv (tests/service/test_install.py); this is the
quick check of the same promise: `service.cli` and what it imports must not reach numpy,
SQLAlchemy, FastAPI or an engine package at import time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.service.test_install import BLOCKER, ROOT

# What the server extras bring in without naming it (vLLM's own dependencies).
ENGINE_PACKAGES = {"torch", "triton", "vllm", "lm_eval", "transformers"}


def server_modules() -> set[str]:
    """The import names of every distribution the server, suites and cpu extras list: a bare
    install has none of them (tenacity slipped past a hand-written list once)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    listed = (Requirement(r).name for extra in ("server", "suites", "cpu") for r in extras[extra])
    wanted = {canonicalize_name(name) for name in listed} - {"kvcanary"}
    found = {m for m, dists in packages_distributions().items() if {canonicalize_name(d) for d in dists} & wanted}
    return found | ENGINE_PACKAGES


def test_the_blocked_list_holds_every_server_dependency() -> None:
    assert {"tenacity", "psutil", "sqlalchemy", "fastapi", "numpy", "jiwer", "datasets"} <= server_modules()
    assert not {"httpx", "typer", "yaml", "pydantic", "rich"} & server_modules()


def test_the_cli_imports_without_the_server_packages() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER, ",".join(sorted(server_modules())), "service.cli", "service.report"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, f"the client imports a server package:\n{result.stdout}{result.stderr}"
