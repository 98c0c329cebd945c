"""Launch parameters and the variant switch shared by the kernel entry points."""

import functools
from dataclasses import astuple, dataclass
from typing import NamedTuple

import torch

VARIANTS = ("fixed", "legacy")


def check_variant(function: str, variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"{function}: variant must be one of {VARIANTS}, got {variant!r}")


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``; an H200's 132 off CUDA (the interpreter), so launches
    there take the same shape as on a GPU host."""
    if device.type != "cuda":
        return 132
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


class Launch(NamedTuple):
    """Resolved launch parameters: key positions per loop step, warps, pipeline stages, and
    split-KV programs per query."""

    tile: int
    num_warps: int
    num_stages: int
    num_splits: int


@dataclass(frozen=True)
class LaunchConfig:
    """Overrides of the tuned launch (benchmarks); a None field keeps the default."""

    tile: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_splits: int | None = None

    def resolve(self, default: Launch) -> Launch:
        return Launch(*(d if mine is None else mine for mine, d in zip(astuple(self), default, strict=True)))
