"""The generated mutants: what ``kernels/generated_mutants.json`` records, and their kernels.

``kernels.mutation_ops`` makes the mutants (one operator at one site of the Triton sources);
``scripts/generate_mutants.py`` ran each against ``fixed`` in Triton's interpreter on probe
shapes (``kernels.mutant_probes``), kept those that differ on at least one shape, dropped the
others as equivalent (their evidence stays in the manifest: max |diff| per shape, 0 on every
one), and split the kept ones once, at random with the seed it records, into a ``tuning``
half and a ``held-out`` half. The held-out half is for measuring the gate: no margin or rule
is to be chosen on it.

A kept mutant is a kernel variant like a catalogued one (``kernels.mutants.VARIANTS``): the
launchers take its id as ``variant=`` and run the kernels of its *family*, the modules of
``FAMILY`` rebuilt from the sources at first use with the mutated file in place (and every
module that imports it rebuilt against the mutated one), each registered with ``linecache``
so that Triton's ``@jit`` reads its source. No mutated copy of a kernel file is kept in the
repository, and the fixed modules are never touched.

The manifest is read with the standard library alone: the service and the CI client list
the variants without torch or Triton.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
import linecache
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from kernels.mutation_ops import Site

MANIFEST = Path(__file__).resolve().parent / "generated_mutants.json"
MANIFEST_NAME = "kernels/generated_mutants.json"
Half = Literal["tuning", "held-out"]
HALVES: tuple[Half, ...] = ("tuning", "held-out")
# The kernel modules in import order: a family rebuilds the mutated one and those after it that import it.
FAMILY = (
    "kernels._split_kv",
    "kernels._unified_kernel",
    "kernels._decode_kernel",
    "kernels.unified_attention",
    "kernels.decode_attention",
)
ENTRY_POINTS = {"unified_attention": "kernels.unified_attention", "decode_attention_fwd": "kernels.decode_attention"}


@dataclass(frozen=True)
class Generated:
    """One mutant of the manifest. ``evidence``: shape -> max |diff| against fixed ("nan" where
    the mutant's output has NaN or inf where fixed's is finite, "error: ..." where it raised)."""

    id: str
    operator: str
    file: str
    function: str
    line: int
    before: str
    after: str
    changes: str
    status: Literal["kept", "equivalent", "hangs"]
    half: Half | None
    kernels: tuple[str, ...]
    evidence: dict[str, float | str] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """What it changes, in one line: operator, place, code."""
        return f"{self.changes}: `{self.before}` -> `{self.after}` ({self.function}, {self.file} line {self.line})"


@dataclass(frozen=True)
class Manifest:
    seed: int
    shapes: dict[str, str]
    mutants: tuple[Generated, ...]

    @property
    def kept(self) -> dict[str, Generated]:
        return {m.id: m for m in self.mutants if m.status == "kept"}

    def half(self, name: str) -> list[str]:
        if name not in HALVES:
            raise ValueError(f"generated mutants: half must be one of {', '.join(HALVES)}, got {name!r}")
        return [m.id for m in self.mutants if m.half == name]


def load(path: Path = MANIFEST) -> Manifest:
    raw = json.loads(path.read_text())
    mutants = tuple(
        Generated(**{**entry, "kernels": tuple(entry["kernels"]), "evidence": dict(entry["evidence"])})
        for entry in raw["mutants"]
    )
    return Manifest(seed=int(raw["seed"]), shapes=dict(raw["shapes"]), mutants=mutants)


@functools.cache
def manifest() -> Manifest:
    """The committed manifest (an empty one where the file is absent: nothing generated yet)."""
    if not MANIFEST.exists():
        return Manifest(seed=0, shapes={}, mutants=())
    return load()


def kept() -> dict[str, Generated]:
    """The selectable generated mutants, by id."""
    return manifest().kept


def largest_half() -> int:
    """The mutants of the larger half: what one mutation batch's run must hold beside its control."""
    return max((len(manifest().half(half)) for half in HALVES), default=0)


# -- building a family ------------------------------------------------------------------------


def _imports(tree: ast.Module) -> set[str]:
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


class _Rebind(ast.NodeTransformer):
    """``from kernels.x import ...`` -> ``from <family>.x import ...`` for the rebuilt modules."""

    def __init__(self, renamed: dict[str, str]) -> None:
        self.renamed = renamed

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.ImportFrom:
        if node.module in self.renamed:
            node.module = self.renamed[node.module]
        return node


def _source_tree(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return ast.parse(Path(spec.origin).read_text())


def _exec_module(name: str, filename: str, tree: ast.Module) -> ModuleType:
    """Run ``tree`` as module ``name`` whose source ``linecache`` serves under ``filename``."""
    source = ast.unparse(tree) + "\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _interpreted() -> bool:
    """Whether the fixed kernels were built for Triton's interpreter (a family is built the same way)."""
    from triton.runtime.interpreter import InterpretedFunction

    from kernels._unified_kernel import _unified_attention_kernel

    return isinstance(_unified_attention_kernel, InterpretedFunction)


@functools.cache
def family(mutant_id: str) -> dict[str, ModuleType]:
    """The kernel modules of a kept mutant, built once per process."""
    from kernels.mutation_ops import Site

    mutant = kept().get(mutant_id)
    if mutant is None:
        raise KeyError(f"{mutant_id!r} is no kept generated mutant of {MANIFEST_NAME}")
    return build_family(
        Site(mutant.id, mutant.operator, mutant.file, mutant.function, mutant.line, mutant.before, mutant.after)
    )


def build_family(site: Site) -> dict[str, ModuleType]:
    """The kernel modules of the mutant at ``site``: module name -> module (the fixed one where
    unchanged). ValueError where the sources no longer hold the site."""
    from kernels.mutation_ops import mutated_tree

    package = f"kvcanary_generated.{site.id}"
    renamed: dict[str, str] = {}
    built: dict[str, ModuleType] = {}
    interpret = _interpreted()
    previous = os.environ.get("TRITON_INTERPRET")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # Triton decides at decoration whether a function is interpreted
    try:
        for name in FAMILY:
            short = name.rsplit(".", 1)[1]
            if name == site.module:
                tree = mutated_tree(site)
            else:
                tree = _source_tree(name)
                if not _imports(tree) & renamed.keys():
                    built[name] = importlib.import_module(name)
                    continue
            tree = _Rebind(renamed).visit(tree)
            renamed[name] = f"{package}.{short}"
            built[name] = _exec_module(renamed[name], f"<generated mutant {site.id}: kernels/{short}.py>", tree)
    finally:
        if interpret:
            if previous is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = previous
    return built


def launcher(mutant_id: str, entry_point: str) -> Callable[..., Any]:
    """The entry point (``unified_attention`` or ``decode_attention_fwd``) of the mutant's family:
    the fixed one where the mutated file is not on its path. Call it with ``variant="fixed"``."""
    found: Callable[..., Any] = getattr(family(mutant_id)[ENTRY_POINTS[entry_point]], entry_point)
    return found
