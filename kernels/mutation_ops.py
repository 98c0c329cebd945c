"""Mutation operators over the kernels' Triton sources: the generated mutants' sites and texts.

Each operator finds the places in the ``@triton.jit`` functions of ``kernels/_split_kv.py``,
``kernels/_unified_kernel.py`` and ``kernels/_decode_kernel.py`` where one kind of kernel bug
can be made (drop the online-softmax correction, shift a bound by one, skip a tile, round an
accumulator to bf16, read through a wrong stride...), in source order; where it finds more
than ``SITES_PER_FILE`` in a file, that many are drawn with a fixed seed, so the same sources
always give the same mutants. A mutant is one operator at one site; its id
(``gen_<operator>_<file>_<n>``) names the operator, the file and the site's rank among that
operator's sites in that file. Its source is the file's syntax tree with that one node
replaced, written out again (``ast.unparse``): comments and layout go, the code stays.

Code that the fixed kernels never run is no site: the catalogue's ``MUTANT == "..."``
branches, the pre-fix paths under ``READ_PAST_SEQ_LEN`` and the int32 branch of
``PAGE_OFFSET_INT64``. A mutant that computes exactly what ``fixed`` computes on every probed
shape is dropped as equivalent (``kernels.generated_mutants``); the operators do not try to
guess that.

Only the standard library: the manifest's tests and the service read the ids without torch.
"""

from __future__ import annotations

import ast
import copy
import math
import random
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent
# file short name (in mutant ids) -> module; the order the generator walks them
FILES: dict[str, str] = {
    "splitkv": "kernels._split_kv",
    "unified": "kernels._unified_kernel",
    "decode": "kernels._decode_kernel",
}
ACCUMULATORS = ("acc", "l_i", "denom")  # the online softmax's running sums
CORRECTIONS = ("alpha", "rescale")  # the factors that rescale them when the maximum moves
STALE = {"m_new": "m_i", "safe_max": "lse_max"}  # the new maximum -> the one before the step
# An operator with more sites in a file mutates this many of them (drawn with a fixed seed), so
# that measuring every mutant in the interpreter stays within half an hour on a CPU host (125 in all).
SITES_PER_FILE = 5


@dataclass(frozen=True)
class Site:
    """One generated mutant: where it is and what it does to the code."""

    id: str
    operator: str
    file: str  # short name, a key of FILES
    function: str
    line: int
    before: str
    after: str

    @property
    def module(self) -> str:
        return FILES[self.file]

    @property
    def path(self) -> str:
        return f"kernels/{self.module.rsplit('.', 1)[1]}.py"


@dataclass(frozen=True)
class Operator:
    """``finds(node)``: whether ``node`` is a site; ``mutate(node)``: its replacement (a new node)."""

    name: str
    changes: str
    finds: Callable[[ast.AST], bool]
    mutate: Callable[[ast.AST], ast.AST]


def _is_call(node: ast.AST, *names: str) -> bool:
    """``tl.<name>(...)`` for one of ``names``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "tl"
        and node.func.attr in names
    )


def _base_name(node: ast.AST) -> str | None:
    """``x`` for ``x`` and ``x[...]``."""
    if isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _rescales(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mult)
        and _base_name(node.right) in CORRECTIONS
        and _base_name(node.left) in ACCUMULATORS
    )


def _drop_rescale(node: ast.AST) -> ast.AST:
    assert isinstance(node, ast.BinOp)
    return copy.deepcopy(node.left)


_SHIFTED: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}


def _bound(node: ast.AST) -> bool:
    return isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _SHIFTED


def _shift_bound(node: ast.AST) -> ast.AST:
    assert isinstance(node, ast.Compare)
    return ast.Compare(copy.deepcopy(node.left), [_SHIFTED[type(node.ops[0])]()], copy.deepcopy(node.comparators))


def _min_or_max(node: ast.AST) -> bool:
    return _is_call(node, "minimum", "maximum")


def _swap_min_max(node: ast.AST) -> ast.AST:
    new = copy.deepcopy(node)
    assert isinstance(new, ast.Call) and isinstance(new.func, ast.Attribute)
    new.func.attr = "maximum" if new.func.attr == "minimum" else "minimum"
    return new


def _accumulates(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in ACCUMULATORS
        and not isinstance(node.value, ast.Call)  # the initial tl.zeros, not an accumulation step
    )


def _round_bf16(node: ast.AST) -> ast.AST:
    """``x = e`` -> ``x = e.to(tl.bfloat16).to(tl.float32)``: the sum kept in bf16 between steps."""
    assert isinstance(node, ast.Assign)
    value: ast.expr = copy.deepcopy(node.value)
    for dtype in ("bfloat16", "float32"):
        value = ast.Call(
            ast.Attribute(value, "to", ast.Load()), [ast.Attribute(ast.Name("tl", ast.Load()), dtype, ast.Load())], []
        )
    return ast.copy_location(ast.Assign([copy.deepcopy(node.targets[0])], value), node)


def _is_stride(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id.startswith("stride_")


_STRIDE_NEXT = {"blk": "pos", "page": "pos", "pos": "head", "head": "pos", "dim": "pos", "tok": "head", "seq": "item"}


def _wrong_stride(node: ast.AST) -> ast.AST:
    """A stride of the same tensor for another dimension (positions <-> heads, pages -> positions)."""
    assert isinstance(node, ast.Name)
    stem, _, dim = node.id.rpartition("_")
    return ast.Name(f"{stem}_{_STRIDE_NEXT.get(dim, 'pos')}", ast.Load())


def _strided(node: ast.AST) -> bool:
    """A stride that has a sibling of another dimension in the same function (``_candidates`` marks it)."""
    return _is_stride(node) and getattr(node, "_sibling", False)


def _indexed_load(node: ast.AST) -> bool:
    return _is_call(node, "load") and bool(node.args) and isinstance(node.args[0], ast.BinOp)  # type: ignore[attr-defined]


def _index_plus_one(node: ast.AST) -> ast.AST:
    assert isinstance(node, ast.Call)
    new = copy.deepcopy(node)
    new.args[0] = ast.BinOp(new.args[0], ast.Add(), ast.Constant(1))
    return new


def _tile_loop(node: ast.AST) -> bool:
    return (_is_call(node, "range") and len(node.args) == 2) or (  # type: ignore[attr-defined]
        _is_call(node, "static_range") and len(node.args) == 1  # type: ignore[attr-defined]
    )


def _skip_last_tile(node: ast.AST) -> ast.AST:
    assert isinstance(node, ast.Call)
    new = copy.deepcopy(node)
    new.args[-1] = ast.BinOp(new.args[-1], ast.Sub(), ast.Constant(1))
    return new


def _cdiv(node: ast.AST) -> bool:
    return _is_call(node, "cdiv")


def _floor_div(node: ast.AST) -> ast.AST:
    """``tl.cdiv(a, b)`` -> ``a // b``: a count that drops the partial last tile or piece."""
    assert isinstance(node, ast.Call)
    return ast.BinOp(copy.deepcopy(node.args[0]), ast.FloorDiv(), copy.deepcopy(node.args[1]))


def _masked_load(node: ast.AST) -> bool:
    return _is_call(node, "load") and any(k.arg == "mask" for k in node.keywords)  # type: ignore[attr-defined]


def _drop_load_mask(node: ast.AST) -> ast.AST:
    assert isinstance(node, ast.Call)
    new = copy.deepcopy(node)
    new.keywords = [k for k in new.keywords if k.arg not in ("mask", "other")]
    return new


def _where(node: ast.AST) -> bool:
    return _is_call(node, "where") and len(node.args) == 3  # type: ignore[attr-defined]


def _drop_where(node: ast.AST) -> ast.AST:
    """``tl.where(c, a, b)`` -> ``a``: the condition (a mask, a guard) ignored."""
    assert isinstance(node, ast.Call)
    return copy.deepcopy(node.args[1])


def _stale(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in STALE


def _use_stale(node: ast.AST) -> ast.AST:
    assert isinstance(node, ast.Name)
    return ast.Name(STALE[node.id], ast.Load())


def bf16(value: float) -> float:
    """``value`` rounded to bf16 (8 significant bits, to nearest even)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def _inexact_constant(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, float)
        and math.isfinite(node.value)
        and bf16(node.value) != node.value
    )


def _round_constant(node: ast.AST) -> ast.AST:
    assert isinstance(node, ast.Constant) and isinstance(node.value, float)
    return ast.Constant(bf16(node.value))


OPERATORS: tuple[Operator, ...] = (
    Operator("no_rescale", "drops the online-softmax correction of a running sum", _rescales, _drop_rescale),
    Operator(
        "stale_max", "uses the running maximum from before the step where the new one belongs", _stale, _use_stale
    ),
    Operator("bound_shift", "moves a loop, mask or split bound by one (< and <= swapped)", _bound, _shift_bound),
    Operator("swap_minmax", "takes the minimum where the maximum belongs, or the reverse", _min_or_max, _swap_min_max),
    Operator("narrow_acc", "keeps a running sum in bf16 between steps", _accumulates, _round_bf16),
    Operator("wrong_stride", "steps through a tensor with the stride of another dimension", _strided, _wrong_stride),
    Operator("wrong_index", "loads one element past the index it should", _indexed_load, _index_plus_one),
    Operator("skip_tile", "stops a tile or part loop one step early", _tile_loop, _skip_last_tile),
    Operator("floor_div", "counts tiles or pieces rounding down (drops the partial one)", _cdiv, _floor_div),
    Operator("drop_mask", "loads without the mask that keeps reads in bounds", _masked_load, _drop_load_mask),
    Operator("drop_where", "ignores a tl.where condition (mask or guard), takes its first value", _where, _drop_where),
    Operator("bf16_const", "rounds a float constant (log2 e, ln 2) to bf16", _inexact_constant, _round_constant),
)
OPERATOR_NAMES = {op.name: op for op in OPERATORS}


def _is_jit(node: ast.FunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _live_children(node: ast.AST) -> Iterator[ast.AST]:
    """The children the fixed kernels run: not a catalogued mutant's branch, not a pre-fix path,
    nothing of a branch's test (the switches stay), nothing of a static assertion."""
    if isinstance(node, ast.If):
        names = _names(node.test)
        if "MUTANT" in names and not isinstance(node.test, ast.BoolOp):
            yield from node.orelse
            return
        if "READ_PAST_SEQ_LEN" in names:
            yield from node.orelse
            return
        if "PAGE_OFFSET_INT64" in names:
            yield from node.body
            return
        yield from node.body
        yield from node.orelse
        return
    if isinstance(node, ast.Expr) and _is_call(node.value, "static_assert"):
        return
    yield from ast.iter_child_nodes(node)


def _preorder(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    for child in _live_children(node):
        yield from _preorder(child)


def _candidates(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(function, node) for every node of the module's jit functions' live code, in source order."""
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef) or not _is_jit(function):
            continue
        params = {a.arg for a in function.args.args}
        for statement in function.body:
            for node in _preorder(statement):
                if _is_stride(node):
                    assert isinstance(node, ast.Name)
                    stem, _, dim = node.id.rpartition("_")
                    node._sibling = f"{stem}_{_STRIDE_NEXT.get(dim, 'pos')}" in params  # type: ignore[attr-defined]
                yield function.name, node


def parse(file: str) -> ast.Module:
    return ast.parse((KERNELS_DIR / f"{FILES[file].rsplit('.', 1)[1]}.py").read_text())


def _located(tree: ast.Module, operator: Operator) -> list[tuple[str, ast.AST]]:
    return [(function, node) for function, node in _candidates(tree) if operator.finds(node)]


def sampled(operator: str, file: str, count: int) -> list[int]:
    """The ranks of the sites an operator mutates in a file: all, or ``SITES_PER_FILE`` of them
    drawn with a seed of the operator's and the file's names (the same every time)."""
    if count <= SITES_PER_FILE:
        return list(range(count))
    return sorted(random.Random(f"{operator}:{file}").sample(range(count), SITES_PER_FILE))


def sites() -> list[Site]:
    """The generated mutants of the current sources, in a fixed order (file, operator, site)."""
    found = []
    for file in FILES:
        tree = parse(file)
        for operator in OPERATORS:
            located = _located(tree, operator)
            for rank in sampled(operator.name, file, len(located)):
                function, node = located[rank]
                found.append(
                    Site(
                        id=f"gen_{operator.name}_{file}_{rank}",
                        operator=operator.name,
                        file=file,
                        function=function,
                        line=getattr(node, "lineno", 0),
                        before=ast.unparse(node),
                        after=ast.unparse(ast.fix_missing_locations(operator.mutate(node))),
                    )
                )
    return found


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, new: ast.AST) -> None:
        self.target, self.new = target, new

    def visit(self, node: ast.AST) -> ast.AST:
        if node is self.target:
            return ast.copy_location(self.new, node)
        return super().visit(node)


def mutated_tree(site: Site) -> ast.Module:
    """The file's syntax tree with ``site`` applied; ValueError where the sources no longer hold it."""
    tree = parse(site.file)
    located = _located(tree, OPERATOR_NAMES[site.operator])
    rank = int(site.id.rsplit("_", 1)[1])
    if rank >= len(located) or located[rank][0] != site.function or ast.unparse(located[rank][1]) != site.before:
        raise ValueError(
            f"generated mutant {site.id}: {site.path} no longer has `{site.before}` in {site.function} at that "
            "site; the kernel sources changed since kernels/generated_mutants.json was written: run "
            "scripts/generate_mutants.py again"
        )
    target = located[rank][1]
    new = _Replace(target, OPERATOR_NAMES[site.operator].mutate(target)).visit(tree)
    assert isinstance(new, ast.Module)
    return ast.fix_missing_locations(new)
