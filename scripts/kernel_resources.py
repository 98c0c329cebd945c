"""Registers, spills and shared memory of the MLA decode kernel compiled for sm_90, no GPU needed.

Triton compiles for a named target with its bundled ptxas, so the launch defaults can be
checked on any host: a program that spills, or needs more shared memory than a
multiprocessor has (227 KB on Hopper), is slow whatever the schedule. Pointers and strides
get the 16-divisibility the JIT gives them at a real launch (without it every load is
scalar and the numbers mean nothing).

    python scripts/kernel_resources.py
"""

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.decode_attention import _decode_split_kernel, _pages_a_tile_meets

_POINTERS = {
    "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "table_ptr": "*i32", "seq_lens_ptr": "*i32",
    "partials_ptr": "*fp32", "sched_ptr": "*i32",
}  # fmt: skip
_UNALIGNED = ("scale", "logit_cap", "num_seqs", "num_items", "min_tiles")


def mla_constexprs(heads: int, heads_per_program: int, tile: int, page: int) -> dict[str, int | bool]:
    """The kernel's constexprs for MLA (576/512 latents, fixed variant) as decode_attention_fwd
    sets them by default (TMA copies for 64-head groups on pages the tiles divide); every
    constexpr the kernel declares must be here (a renamed one fails loudly)."""
    constexprs: dict[str, int | bool] = {
        "Q_PER_KV": heads, "HEADS_PER_PROGRAM": heads_per_program, "BLOCKS_PER_KV": -(-heads // heads_per_program),
        "BLOCK_H": max(16, triton.next_power_of_2(heads_per_program)), "QK_MAIN": 512, "QK_MAIN_PAD": 512,
        "QK_ROPE": 64, "QK_ROPE_PAD": 64, "V_DIM": 512, "V_PAD": 512, "PAGE_SIZE": page, "TILE": tile,
        "PAGES": _pages_a_tile_meets(page, tile), "V_IS_K_MAIN": True, "USE_LOGIT_CAP": False,
        "PAGE_OFFSET_INT64": True, "SEQS_PAD": 256,
        "ROW_TMA": heads_per_program > 32 and _pages_a_tile_meets(page, tile) == 1,
    }  # fmt: skip
    function = inspect.signature(_decode_split_kernel.fn)  # the Python function (compiled or interpreted)
    declared = {name for name, param in function.parameters.items() if "constexpr" in str(param.annotation)}
    if declared != set(constexprs):
        raise ValueError(f"the kernel's constexprs changed: {sorted(declared ^ set(constexprs))}")
    return constexprs


def resources(heads: int, heads_per_program: int, tile: int, num_warps: int, num_stages: int, page: int) -> str:
    """One MLA configuration compiled for sm_90: its registers, spills, shared memory, MMA kind."""
    constexprs = mla_constexprs(heads, heads_per_program, tile, page)
    names = _decode_split_kernel.arg_names
    # Whole tiles come as TMA copies where the tiles divide the page (decode_attention_fwd).
    descriptors = {"k_rows_desc": f"tensordesc<bf16[{tile},512]>", "rope_rows_desc": f"tensordesc<bf16[{tile},64]>"}
    if not constexprs["ROW_TMA"]:
        descriptors = {name: "*bf16" for name in descriptors}
    types = {**_POINTERS, **descriptors}
    signature = {
        n: "constexpr" if n in constexprs else types.get(n, "fp32" if n in ("scale", "logit_cap") else "i32")
        for n in names
    }
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if signature[n] != "constexpr" and n not in _UNALIGNED
    }
    source = ASTSource(
        _decode_split_kernel, signature, constexprs={(names.index(n),): v for n, v in constexprs.items()}, attrs=aligned
    )
    kernel = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvcanary_decode_{os.getpid()}.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    usage = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    cubin.unlink()
    registers = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    ptx = kernel.asm["ptx"]
    return (
        f"registers {registers.group(1) if registers else '?'}, spill stack {stack.group(1) if stack else '?'} B, "
        f"shared {kernel.metadata.shared // 1024} KB, {'wgmma' if 'wgmma' in ptx else 'mma.sync'}"
        + (", TMA copies" if constexprs["ROW_TMA"] else "")
    )


def main() -> None:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    print("MLA decode on sm_90: heads, heads a program, tile, warps, stages, page")
    configs = [
        (16, 16, 64, 4, 2, 64), (128, 64, 64, 8, 2, 64), (128, 64, 32, 8, 2, 64), (128, 32, 64, 4, 2, 64),
        (8, 8, 64, 4, 3, 480), (8, 8, 32, 4, 3, 480),
    ]  # fmt: skip
    for config in configs:
        print(config, resources(*config), flush=True)


if __name__ == "__main__":
    main()
