"""kvcanary's wheel and what it needs on a GPU host beyond what the host and the vLLM kit bring.

    python scripts/gpu/pack_wheels.py REPO OUT [--python PY] [--have FILE ...]

Builds the wheels of `REPO[server,suites]` (everything the gate runs on the host: the service,
its database layer and the suites; the client extra alone lacks SQLAlchemy, FastAPI, lm-eval)
with PY, the interpreter whose version the host runs, into OUT/.alldeps, then copies to
OUT/wheels kvcanary's wheel and every wheel whose distribution is named in none of the
`--have` files. A `--have` file is either a list (one distribution a line, `#` comments: the
kit's host-packages.txt) or a kit's closure.json (`{"wheels": {name: file}}`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

EXTRAS = "server,suites"


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_have(path: Path) -> set[str]:
    """Distribution names a host list or a kit closure says are there already."""
    text = path.read_text()
    if path.suffix == ".json":
        return {normalise(name) for name in json.loads(text)["wheels"]}
    return {normalise(line.split("#")[0].strip()) for line in text.splitlines() if line.split("#")[0].strip()}


def source_tree(repo: Path, into: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked ones it does not ignore), copied
    to `into`: a wheel built in place reuses setuptools' `build/` folder and would carry modules
    deleted since it was last built. Outside a git checkout, `repo` itself."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True,
    )  # fmt: skip
    if listed.returncode != 0:
        return repo
    shutil.rmtree(into, ignore_errors=True)
    for name in filter(None, listed.stdout.split("\0")):
        if (repo / name).is_file():  # a deleted file is still listed until the deletion is staged
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, into / name)
    return into


def pack(repo: Path, out: Path, python: str, have: set[str]) -> list[str]:
    """Build, then keep kvcanary and what is not in `have`; returns the kept wheel file names."""
    alldeps, wheels = out / ".alldeps", out / "wheels"
    for folder in (alldeps, wheels):
        shutil.rmtree(folder, ignore_errors=True)
    wheels.mkdir(parents=True)
    source = source_tree(repo, out / ".source")
    subprocess.run(
        [python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "-w", str(alldeps), f"{source}[{EXTRAS}]"],
        check=True,
    )
    kept = []
    for wheel in sorted(alldeps.glob("*.whl")):
        name = normalise(wheel.name.split("-")[0])
        if name == "kvcanary" or name not in have:
            shutil.copy(wheel, wheels / wheel.name)
            kept.append(wheel.name)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--have", type=Path, action="append", default=[])
    args = parser.parse_args()
    have = set().union(*(read_have(path) for path in args.have))
    kept = pack(args.repo.resolve(), args.out.resolve(), args.python, have)
    print(f"{len(kept)} wheels beside the kit and the host:", ", ".join(kept))


if __name__ == "__main__":
    main()
