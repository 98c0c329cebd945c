"""kvcanary's attention kernels: fixed Triton kernels with legacy twins, and references.

``unified_attention`` and ``decode_attention_fwd`` take vLLM's arguments in vLLM's order
(plus keyword-only ``variant="fixed" | "legacy"``), so they can replace vLLM's functions
of the same names as they are. Import them from their modules; this package imports nothing,
so the service can read injection receipts (``kernels.receipt``) without torch or Triton.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# A kernel's name (what the plugin's targets call it) -> the module that defines it.
KERNEL_MODULES = {"unified_attention": "kernels.unified_attention", "decode_attention_fwd": "kernels.decode_attention"}


def kernel(name: str) -> Callable[..., Any]:
    """The kernel called `name`, importing its module (and torch, Triton) now."""
    if name not in KERNEL_MODULES:
        raise KeyError(f"kvcanary has no kernel {name!r}; kernels: {', '.join(sorted(KERNEL_MODULES))}")
    found: Callable[..., Any] = getattr(importlib.import_module(KERNEL_MODULES[name]), name)
    return found
