"""The import graph of kvcanary's own modules: no circle, and no arrow up the layers.

Layers, bottom first: `kernels` (runs inside vLLM's processes: imports nothing of ours), `evals`
(suites, kinds, statistics: imports no `service`), `service`. Inside `evals`, the records a suite
produces, the number format and the `Retry-After` reading import nothing of ours (the bare
client imports the last two), and a metric kind imports no suite (suites declare their metrics
with kinds). Every `import` statement counts wherever it stands: at the top, in an
`if TYPE_CHECKING:` block or inside a function, since each of those once hid a circle. A
registry that loads modules by name (`importlib.import_module`) is not an import statement.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "evals", "service")
# Modules (and packages, with what lies under them) that must not import the modules named.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "kernels": ("evals", "service"),
    "evals": ("service",),
    "evals.kinds": ("evals.suites",),
    "evals.records": PACKAGES,
    "evals.numbers": PACKAGES,
    "evals.retry_after": PACKAGES,
    "evals.registry": PACKAGES,
    "evals.pool": PACKAGES,
}

Graph = dict[str, set[str]]


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom) -> Iterable[str]:
    """The dotted names one statement imports: `from a.b import c` is a.b.c (a module or a name in a.b)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
    return [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path) -> Graph:
    """Module -> the project modules it imports (the longest known prefix of each imported name)."""
    modules = _modules(root)
    graph: Graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for imported in _imported(name, path, node):
                    while imported and imported not in modules:
                        imported = imported.rpartition(".")[0]
                    if imported and imported != name:
                        targets.add(imported)
        graph[name] = targets
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def upward(graph: Graph) -> list[str]:
    """Every arrow FORBIDDEN rules out, as `importer -> imported`."""
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        for layer, banned in FORBIDDEN.items()
        if _under(source, layer) and any(_under(target, b) for b in banned)
    )


def test_no_module_of_ours_sits_in_an_import_circle() -> None:
    assert circles(import_graph(ROOT)) == []


def test_no_import_points_up_the_layers() -> None:
    assert upward(import_graph(ROOT)) == []


def test_the_graph_sees_imports_hidden_in_type_checking_blocks_and_functions(tmp_path: Path) -> None:
    """The checks above would pass on an empty graph; this tree has one circle of each hidden kind."""
    files = {
        "kernels/__init__.py": "",
        "kernels/plugin.py": "def load():\n    from evals import records\n",
        "evals/__init__.py": "",
        "evals/records.py": "",
        "evals/kinds/__init__.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from evals.suites.base import Sample\n"
        ),
        "evals/suites/__init__.py": "",
        "evals/suites/base.py": "from ..kinds import MetricKind\n",
        "service/__init__.py": "",
        "service/arms.py": "from service.profiles import Profile\n",
        "service/profiles.py": "def check():\n    from service import arms\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert circles(graph) == [["evals.kinds", "evals.suites.base"], ["service.arms", "service.profiles"]]
    assert upward(graph) == ["evals.kinds -> evals.suites.base", "kernels.plugin -> evals.records"]
