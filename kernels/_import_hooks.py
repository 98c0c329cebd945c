"""Run a callback right after a named module is imported, or at once if it already was.

The plugin loads in every vLLM process, but the backend, block-pool and model-runner modules it
patches are imported later (and only in the processes that need them). Importing them eagerly
would cost seconds in processes that never run attention; deferring the patch to the import
also covers a module first imported in a process forked after the plugin loaded.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]

_lock = threading.RLock()
_callbacks: dict[str, list[Callback]] = {}


def when_imported(module_name: str, callback: Callback) -> None:
    """Call `callback(module)` once `module_name` is imported (now, if it is already)."""
    with _lock:
        module = sys.modules.get(module_name)
        if module is None:
            _callbacks.setdefault(module_name, []).append(callback)
            if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _PostImportFinder())
            return
    callback(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of a watched module to run its callbacks."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallbackLoader(spec.loader)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        # Put the real loader back first, so nothing downstream ever sees this wrapper.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        with _lock:
            callbacks = _callbacks.pop(module.__name__, [])
        for callback in callbacks:
            callback(module)
