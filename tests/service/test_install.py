"""Install profiles: the client installs without the server's packages, the server without the engine's.

`pip install kvcanary` (no extras) must give CI a working `kvcanary submit --wait --junit`;
`kvcanary[server]` must import without torch, vLLM or lm-eval, which only engine hosts install.
"""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

import evals
import service
from service.roles import Role
from tests.service.conftest import StartService

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PACKAGES = ("torch", "triton", "vllm", "lm_eval", "transformers")
# Engine-side modules: they build fixture models or load inside vLLM, never in the service.
ENGINE_SIDE = {
    "evals.fixtures.degraded",
    "evals.fixtures.gsm8k_mla_model",
    "evals.fixtures.gsm8k_model",
    "evals.fixtures.retrieval_model",
    "evals.fixtures.whisper_en_model",
    "service.__main__",  # runs the CLI on import
}

# Raises on any import of the named top-level packages, as if they were not installed.
BLOCKER = """
import importlib, importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not in this install profile)")
        return None
sys.meta_path.insert(0, Blocked())
failed = []
for module in sys.argv[2:]:
    try:
        importlib.import_module(module)
    except Exception as exc:
        failed.append(f"{module}: {exc!r}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def _modules(*packages: object) -> list[str]:
    names = []
    for package in packages:
        prefix = f"{package.__name__}."  # type: ignore[attr-defined]
        for info in pkgutil.walk_packages(package.__path__, prefix):  # type: ignore[attr-defined]
            if ".migrations." not in info.name:
                names.append(info.name)
    return sorted(set(names) - ENGINE_SIDE)


def test_every_server_module_imports_without_the_engine_packages() -> None:
    modules = _modules(service, evals)
    assert "service.app" in modules and "service.runs.pipeline" in modules and "evals.suites.gsm8k" in modules
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER, ",".join(ENGINE_PACKAGES), *modules],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, f"modules importing an engine package at import:\n{result.stdout}{result.stderr}"


def test_the_client_installs_alone_and_waits_for_a_verdict_with_junit(
    start_service: StartService, tmp_path: Path
) -> None:
    """The wheel, no extras, in a fresh venv: CI's `kvcanary submit --wait --junit` against a live service.

    The service runs no worker (no engine here): the run ends when the test cancels it through
    the API, and the client then reports that end and exits 2, as CI sees a run that did not pass.
    """
    source = tmp_path / "source"  # a copy: building writes metadata beside the sources
    source.mkdir()
    for part in ("pyproject.toml", "README.md", "service", "evals", "kernels"):
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / part, source / part)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    wheel_build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(source)]
    subprocess.run(wheel_build, check=True, capture_output=True, timeout=300)
    [wheel] = (tmp_path / "dist").glob("kvcanary-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    required = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    heavy = ("sqlalchemy", "fastapi", "torch", "vllm", "lm-eval")
    assert not [line for line in required if any(name in line for name in heavy)], required

    # The fresh environment must not see this one's kvcanary or packages.
    bare_env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    installed = subprocess.run(
        [*install, "-c", str(ROOT / "constraints.txt"), str(wheel)],
        env=bare_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    absent = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print([m for m in ('sqlalchemy', 'fastapi', 'torch', "
         "'vllm', 'lm_eval') if u.find_spec(m)])"],
        env=bare_env, capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert absent.stdout.strip() == "[]", absent.stdout
    kvcanary = str(venv / "bin" / "kvcanary")
    helped = subprocess.run(
        [kvcanary, "--help"], env=bare_env, capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert helped.returncode == 0 and "submit" in helped.stdout, helped.stderr

    live = start_service()
    token = live.token(Role.CI)
    junit = tmp_path / "junit.xml"
    client = subprocess.Popen(
        [kvcanary, "submit", "--url", live.url, "--profile", "gsm8k-tiny-cpu", "--label", "git_sha=abc123",
         "--wait", "--poll", "0.2", "--junit", str(junit)],
        env={**bare_env, "KVCANARY_TOKEN": token, "COLUMNS": "200"},
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    try:
        runs: list[dict[str, object]] = []
        deadline = time.monotonic() + 60
        while not runs and client.poll() is None and time.monotonic() < deadline:
            runs = httpx.get(f"{live.url}/api/v1/runs", headers=headers).json()["items"]
            time.sleep(0.1)
        assert runs, f"the client queued no run: {client.communicate(timeout=10)}"
        [run] = runs
        assert httpx.post(f"{live.url}/api/v1/runs/{run['id']}/cancel", headers=headers).status_code == 200
        out, err = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 2, (out, err)
    assert f"run {run['id']} queued" in out and "cancelled" in out, out
    report = junit.read_text()
    assert "<testsuite" in report and "gsm8k-tiny-cpu" in report, report
