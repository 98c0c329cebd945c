"""Adapters: take a call exactly as a vLLM backend makes it and hand it to a kvcanary kernel.

vLLM's call sites pass arguments by keyword (triton_attn) or by position (triton_mla), and
newer releases pass extra arguments (0.25 adds `rswa_*` and `mm_prefix_clamp_sliding_window`).
An argument the kvcanary kernel does not take is dropped only while it holds its inert default;
a live value (say a real `rswa_window`) raises, because silently ignoring a feature would serve
wrong attention under a receipt that claims the fixed kernel.

The variant is read at every call from a `Selection` the plugin owns, so an engine that serves
several arms switches its kernels between them without rebinding anything: `stock` calls vLLM's
original function, any other variant the kvcanary kernel.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_SCALARS = (bool, int, float, str, type(None), enum.Enum)


def _inert(value: Any, default: Any) -> bool:
    if value is None or value is default:
        return True
    if isinstance(value, _SCALARS) and isinstance(default, _SCALARS):
        return bool(value == default)
    return False


@dataclass
class Selection:
    """The variant the adapters of a process serve now, and the switch that chose it (0: the
    engine's start); `on_first_call` fires once per adapter and generation."""

    variant: str
    generation: int = 0


def make_adapter(
    target_name: str,
    original: Callable[..., Any],
    kernel: Callable[..., Any],
    selection: Selection,
    on_first_call: Callable[[], None],
) -> Callable[..., Any]:
    """A drop-in for `original` (same parameters) that runs `kernel(..., variant=...)` with the
    selection's variant at call time, or `original` itself while the selection is `stock`."""
    vllm_params = inspect.signature(original).parameters
    order = list(vllm_params)
    defaults = {name: p.default for name, p in vllm_params.items()}
    kernel_params = inspect.signature(kernel).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in kernel_params.values())
    accepted = set(kernel_params) - {"variant"}
    if "variant" not in kernel_params and not takes_any:
        raise TypeError(
            f"kvcanary kernel {kernel.__module__}.{kernel.__qualname__} takes no `variant` "
            "keyword; kernels/__init__.py must export the variant-selecting entry points"
        )
    seen_generation = -1

    @functools.wraps(original)
    def adapter(*args: Any, **kwargs: Any) -> Any:
        nonlocal seen_generation
        variant, generation = selection.variant, selection.generation
        if seen_generation != generation:
            seen_generation = generation
            on_first_call()
        if variant == "stock":
            return original(*args, **kwargs)
        if len(args) > len(order):
            raise TypeError(f"{target_name}: {len(args)} positional arguments, vLLM's signature has {len(order)}")
        call = dict(zip(order, args, strict=False))
        for name, value in kwargs.items():
            if name in call:
                raise TypeError(f"{target_name}: argument {name!r} given twice")
            call[name] = value
        if not takes_any:
            for name in [n for n in call if n not in accepted]:
                if not _inert(call[name], defaults.get(name, inspect.Parameter.empty)):
                    raise NotImplementedError(
                        f"{target_name} was called with {name}={call[name]!r}, a feature kvcanary's "
                        f"{kernel.__qualname__} does not implement; serve this model with the stock "
                        "kernels (variant `stock`) or add the feature to kvcanary's kernel"
                    )
                del call[name]
        return kernel(**call, variant=variant)

    adapter.__kvcanary_adapter__ = {"selection": selection, "kernel": f"{kernel.__module__}.{kernel.__qualname__}"}  # type: ignore[attr-defined]
    return adapter
