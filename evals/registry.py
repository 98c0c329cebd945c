"""One registry type for what profiles and stored rows name: suites and metric kinds.

Each entry is a module's attribute (a suite's `DEFINITION`, a kind's `KIND`), listed once in the
order pages show them; the modules are imported on first use, so importing a package that holds a
registry stays cheap (the bare client reads suite names without numpy), and the mapping is built
once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """`modules`' `attribute` by the name `name_of` gives it: `all()` in listing order, `get(name)` one."""

    def __init__(self, what: str, modules: Sequence[str], attribute: str, name_of: Callable[[T], str]) -> None:
        self.what, self.modules, self.attribute, self.name_of = what, tuple(modules), attribute, name_of
        self._entries: dict[str, T] | None = None

    def all(self) -> Mapping[str, T]:
        if self._entries is None:
            entries: dict[str, T] = {}
            for module_name in self.modules:
                entry: T = getattr(importlib.import_module(module_name), self.attribute)
                entries[self.name_of(entry)] = entry
            self._entries = entries
        return self._entries

    def get(self, name: str) -> T:
        entries = self.all()
        if name not in entries:
            raise KeyError(f"unknown {self.what} {name!r}; known: {', '.join(sorted(entries))}")
        return entries[name]
