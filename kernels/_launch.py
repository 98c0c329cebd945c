"""Launch parameters shared by the kernel entry points."""

import functools
from dataclasses import astuple, dataclass
from typing import NamedTuple

import torch


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def has_tma(device: torch.device) -> bool:
    """Whether kernels on ``device`` can use the tensor memory accelerator: NVIDIA Hopper or
    newer (ROCm reports its GPUs as ``cuda`` devices too, with capabilities of its own), or
    Triton's interpreter (CPU tensors), which emulates it, so CPU tests cover that path."""
    if device.type != "cuda":
        return True
    if torch.version.hip is not None:
        return False
    return _cuda_capability(_cuda_index(device))[0] >= 9


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``; off CUDA (Triton's interpreter, which runs programs
    one by one in Python) a small GPU's 8, so a default launch stays cheap there; tests
    reach an H200-sized grid through ``LaunchConfig.num_splits``."""
    if device.type != "cuda":
        return 8
    return _cuda_sm_count(_cuda_index(device))


class Launch(NamedTuple):
    """Resolved launch parameters: key positions per loop step, warps, pipeline stages, the
    split-KV target of work items per head group (the grid has at least one per sequence;
    1 turns split-KV off where the kernel can run without it), and query heads per program
    (the decode kernel; the unified kernel groups a KV head's query heads itself), and
    whether the decode kernel copies whole MLA tiles with the tensor memory accelerator
    where it can (``kernels.decode_attention``; the unified kernel never does)."""

    tile: int
    num_warps: int
    num_stages: int
    num_splits: int
    heads_per_program: int
    row_tma: bool


@dataclass(frozen=True)
class LaunchConfig:
    """Overrides of the tuned launch (benchmarks); a None field keeps the default.

    ``num_splits`` is the split-KV target of work items per head group over the whole batch
    (not per sequence); given explicitly it also drops the default's minimum piece length.
    ``heads_per_program`` (decode kernel) is capped at the query heads per KV head;
    ``row_tma=False`` keeps the decode kernel on pointer loads (the benchmark's A/B).
    """

    tile: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_splits: int | None = None
    heads_per_program: int | None = None
    row_tma: bool | None = None

    def resolve(self, default: Launch) -> Launch:
        return Launch._make(d if mine is None else mine for mine, d in zip(astuple(self), default, strict=True))
