"""Where the recall sweep puts the key an answer must read, and how it reports a misread key.

Kernels cut the key sequence along tiles (16/32/64 positions), pages (16, 480), the pieces of
a split-KV decode (token-balanced: equal to within a tile, kernels._split_kv) and prefill
chunks (the engine's per-step token budget). A bug on a cut shows on the key just before it or
just after it, so for every length of the ladder the sweep asks for the key at `b - 1` and `b`
for the first, a middle and the last cut `b` of each kind inside the prompt (`per_kind`), plus
the first and the last position a needle can take. Each (length, position) is asked `repeats`
times with other haystacks. Pure functions: the suite (`evals.suites.recall`) sends them, the
gate and tests read the report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evals.fixtures.retrieval_data import MIN_LENGTH, last_position


@dataclass(frozen=True)
class Cuts:
    """The cut sizes a sweep covers, by kind."""

    tiles: tuple[int, ...] = (16, 32, 64)
    pages: tuple[int, ...] = (16, 480)
    splits: tuple[int, ...] = (2, 3, 4, 8)  # pieces a split-KV decode cuts one sequence into
    chunks: tuple[int, ...] = (2048,)  # prefill chunk budgets (max_num_batched_tokens)


@dataclass(frozen=True)
class Item:
    """One prompt of the sweep: the answer's first word reads KV position `position` of a
    `length`-word prompt; `cuts` names the cuts that position sits on."""

    length: int
    position: int
    repeat: int
    cuts: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"L{self.length:05d}-P{self.position:05d}-r{self.repeat}"


def _pick(found: Sequence[int], per_kind: int) -> list[int]:
    """`per_kind` of the sorted `found`, spread from the first to the last."""
    if len(found) <= per_kind:
        return list(found)
    if per_kind == 1:
        return [found[0]]
    return sorted({found[round(i * (len(found) - 1) / (per_kind - 1))] for i in range(per_kind)})


def split_cuts(length: int, pieces: int, tile: int) -> list[int]:
    """Where a token-balanced split-KV decode cuts a `length`-key sequence into `pieces` pieces
    of whole `tile`-key tiles (the first `tiles % pieces` pieces one tile longer)."""
    tiles = math.ceil(length / tile)
    if pieces < 2 or tiles < pieces:
        return []
    base, longer = divmod(tiles, pieces)
    return [(j * base + min(j, longer)) * tile for j in range(1, pieces)]


def _regular(cuts: Cuts) -> list[tuple[str, int]]:
    """The cut kinds at every multiple of their size."""
    return [("tile", s) for s in cuts.tiles] + [("page", s) for s in cuts.pages] + [("chunk", s) for s in cuts.chunks]


def cuts_in(length: int, cuts: Cuts, per_kind: int) -> dict[str, list[int]]:
    """Each cut kind (`tile32`, `page480`, `split4/tile16`, `chunk2048`) -> the cuts `b` (first
    key after the cut) it places in a `length`-word prompt, with `b <= last`."""
    last = last_position(length)
    found: dict[str, list[int]] = {}
    for kind, size in _regular(cuts):
        at = list(range(size, last + 1, size))
        if at:
            found[f"{kind}{size}"] = _pick(at, per_kind)
    for pieces in cuts.splits:
        for tile in cuts.tiles:
            at = [b for b in split_cuts(length, pieces, tile) if 1 <= b <= last]
            if at:
                found[f"split{pieces}/tile{tile}"] = _pick(at, per_kind)
    return found


def labels(position: int, cuts: Cuts) -> tuple[str, ...]:
    """The regular cuts `position` touches: `last of tile64` (the key before a cut) or `first of
    page480` (the key after one)."""
    found = [f"first of {kind}{s}" for kind, s in _regular(cuts) if position % s == 0]
    found += [f"last of {kind}{s}" for kind, s in _regular(cuts) if (position + 1) % s == 0]
    return tuple(found)


def plan(lengths: Sequence[int], cuts: Cuts, per_kind: int, repeats: int) -> list[Item]:
    """Every item of the sweep, by length then position then repeat."""
    items = []
    for length in sorted(set(lengths)):
        if length < MIN_LENGTH:
            raise ValueError(f"recall sweep: length {length} is shorter than the shortest recall prompt ({MIN_LENGTH})")
        named: dict[int, set[str]] = {}
        named.setdefault(0, set()).add("first key")
        named.setdefault(last_position(length), set()).add("last key")
        for kind, at in cuts_in(length, cuts, per_kind).items():
            for b in at:
                named.setdefault(b - 1, set()).add(f"last of {kind}")
                named.setdefault(b, set()).add(f"first of {kind}")
        for position in sorted(named):
            found = tuple(sorted(named[position] | set(labels(position, cuts))))
            items += [Item(length, position, r, found) for r in range(repeats)]
    return items


@dataclass(frozen=True)
class Misread:
    """How often one arm misread the key at one (length, position)."""

    length: int
    position: int
    wrong: int
    prompts: int
    cuts: tuple[str, ...]

    def sentence(self) -> str:
        return f"key {self.position:,} of {self.length:,} misread in {self.wrong} of {self.prompts} prompts"


def misreads(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], Misread]:
    """Per (length, position): the stored rows' `data["recall"]` ({length, position, cuts,
    first_wrong}) counted; a row whose request failed counts as a misread."""
    grouped: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((int(row["length"]), int(row["position"])), []).append(row)
    found = {}
    for (length, position), group in sorted(grouped.items()):
        wrong = sum(1 for r in group if r.get("first_wrong") is not None)
        cuts = tuple(group[0].get("cuts") or ())
        found[(length, position)] = Misread(length, position, wrong, len(group), cuts)
    return found


def table(arms: Mapping[str, Sequence[Mapping[str, Any]]], everything: bool = False) -> str:
    """The per-position table in Markdown, one column per arm ("wrong/prompts"): the positions
    some arm misread (`everything`: all), then a line per arm with its misread positions."""
    counted = {arm: misreads(rows) for arm, rows in arms.items()}
    positions = sorted({p for found in counted.values() for p in found})
    lines = ["| length | key | cuts | " + " | ".join(counted) + " |", "|---|---|---|" + "---|" * len(counted)]
    for p in positions:
        cells = [counted[arm].get(p) for arm in counted]
        if not everything and not any(c is not None and c.wrong for c in cells):
            continue
        cuts = next((c.cuts for c in cells if c is not None), ())
        shown = [f"{c.wrong}/{c.prompts}" if c is not None else "-" for c in cells]
        lines.append(f"| {p[0]:,} | {p[1]:,} | {', '.join(cuts)} | " + " | ".join(shown) + " |")
    if len(lines) == 2:
        lines.append(f"| | | no key misread at any of {len(positions)} positions |" + " |" * len(counted))
    for arm, found in counted.items():
        bad = [m for m in found.values() if m.wrong]
        first = f"; first: {bad[0].sentence()}" if bad else ""
        lines.append(f"\n{arm}: {len(bad)} of {len(found)} positions misread{first}")
    return "\n".join(lines)
