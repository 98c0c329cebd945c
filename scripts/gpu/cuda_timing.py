"""What every section of the kernel benchmark shares: the device, the dtype, and timing by
CUDA-graph replays (decode runs under CUDA graphs in vLLM)."""

from collections.abc import Callable, Mapping

import torch
import triton.testing

DEVICE = "cuda"
DTYPE = torch.bfloat16


def timed_ms(fn: Callable[[], object], rep: int = 40) -> float:
    """Median of CUDA-graph replays, in ms (about ``rep`` ms of replays, 11 times)."""
    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def paired_ms(fns: Mapping[str, Callable[[], object]], rounds: int = 3, rep: int = 40) -> dict[str, float]:
    """Median times of several functions timed in interleaved rounds, so that drift in the
    card's clocks does not bias a ratio."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timed_ms(fn, rep))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}
