"""What the split-KV merge costs: each ragged row timed as it runs and with the merge
skipped (a timing only: the output is then wrong), beside the peer vLLM runs by default on
Hopper (FA3 for GQA, FlashMLA for MLA at page 64), in interleaved CUDA-graph rounds.

The merge is a second kernel after the split one (kernels._split_kv.merge_splits). This
script measures its share of a call, roughly what merging another way could save (a fused
merge could also skip some partial writes); docs/history/kernels-lab.md reads the numbers.

    python scripts/gpu/bench_merge_share.py --vllm-ref .vllm_ref [--cases x16,x32]
"""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from unittest import mock

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench_ragged import gqa_case_fns, mla_case_fns  # noqa: E402
from cuda_timing import paired_ms  # noqa: E402
from ragged_batches import ragged_cases  # noqa: E402
from vllm_ref import load_peers  # noqa: E402

import kernels.decode_attention  # noqa: E402
import kernels.unified_attention  # noqa: E402


def without_merge(fn: Callable[[], torch.Tensor], module: ModuleType) -> Callable[[], None]:
    """``fn`` with the kernel module's merge skipped (also while a CUDA graph captures it)."""

    def run() -> None:
        with mock.patch.object(module, "merge_splits", lambda *args, **kwargs: None):
            fn()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-ref", default=None, help="folder with FA3 and FlashMLA (scripts/gpu/vllm_ref.py)")
    parser.add_argument("--cases", default=None, help="only the rows whose name holds one of these words (a,b,...)")
    args = parser.parse_args()
    peers = load_peers(args.vllm_ref)
    words = args.cases.split(",") if args.cases else None
    print(f"{'case':<34}{'ms':>8}{'no merge':>10}{'merge %':>9}{'peer ms':>9}{'ours/peer':>10}{'no merge/peer':>15}")
    for case in ragged_cases():
        if words and not any(word in case.name for word in words):
            continue
        if case.kind == "gqa":
            fns, _, _ = gqa_case_fns(case, None, peers)
            module: ModuleType = kernels.unified_attention
        else:
            fns, _, _ = mla_case_fns(case, None, peers)
            module = kernels.decode_attention
        timed: dict[str, Callable[[], object]] = {"ours": fns["fixed"], "no merge": without_merge(fns["fixed"], module)}
        if "peer" in fns:
            timed["peer"] = fns["peer"]
        ms = paired_ms(timed, rounds=5, rep=25)
        peer = ms.get("peer")
        if peer is None:
            peer_cells = f"{float('nan'):>9.4f}{'—':>10}{'—':>15}"
        else:
            peer_cells = f"{peer:>9.4f}{ms['ours'] / peer:>10.3f}{ms['no merge'] / peer:>15.3f}"
        share = 100 * (1 - ms["no merge"] / ms["ours"])
        print(f"{case.name:<34}{ms['ours']:>8.4f}{ms['no merge']:>10.4f}{share:>8.1f}%{peer_cells}", flush=True)
        del fns, timed
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
