"""kvcanary's attention kernels: fixed Triton kernels with legacy twins, and references.

``unified_attention`` and ``decode_attention_fwd`` take vLLM's arguments in vLLM's order
(plus keyword-only ``variant="fixed" | "legacy"``), so they can replace vLLM's functions
of the same names as they are.
"""

from kernels._launch import LaunchConfig
from kernels.decode_attention import decode_attention_fwd
from kernels.unified_attention import unified_attention

__all__ = ["LaunchConfig", "decode_attention_fwd", "unified_attention"]
