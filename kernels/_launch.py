"""Launch parameters and the variant switch shared by the kernel entry points."""

from dataclasses import astuple, dataclass
from typing import NamedTuple

VARIANTS = ("fixed", "legacy")


def check_variant(function: str, variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"{function}: variant must be one of {VARIANTS}, got {variant!r}")


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
