"""Registers, spills and shared memory of the decode kernels compiled for sm_90, no GPU needed.

Each line ends with a digest of the machine code (``sass_digest``): a change that must leave
the fixed kernels as they were (a mutant's compile-time switch, kernels/mutants.py) keeps every
digest equal to the previous commit's output.

Triton compiles for a named target with its bundled ptxas, so the launch defaults can be
checked on any host: a program that spills, or needs more shared memory than a
multiprocessor has (227 KB on Hopper), is slow whatever the schedule. Pointers and strides
get the 16-divisibility the JIT gives them at a real launch (without it every load is
scalar and the numbers mean nothing).

Spilled registers live in local memory, cached in L1, which shares its storage with shared
memory; the report counts the local loads and stores in the machine code beside the spill
stack. The same program can spill very differently under two Triton versions, so run it
with the version the GPU host has.

    python scripts/kernel_resources.py
"""

import hashlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels._decode_kernel import _decode_split_kernel
from kernels._split_kv import schedule_lanes
from kernels._unified_kernel import _unified_attention_kernel
from kernels.decode_attention import _pages_a_tile_meets
from kernels.unified_attention import query_rows

_POINTERS = {
    "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "table_ptr": "*i32", "block_table_ptr": "*i32",
    "seq_lens_ptr": "*i32", "cu_seqlens_q_ptr": "*i32", "out_ptr": "*bf16", "partials_ptr": "*fp32",
    "sched_ptr": "*i32",
}  # fmt: skip
_FLOATS = ("scale", "logit_cap", "softcap")
_UNALIGNED = (*_FLOATS, "num_seqs", "num_items", "min_tiles", "fill_items")
_TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def _checked(kernel: Any, constexprs: dict[str, int | bool | str]) -> dict[str, int | bool | str]:
    """``constexprs``, if they are every constexpr ``kernel`` declares (a renamed one fails loudly)."""
    function = inspect.signature(kernel.fn)  # the Python function (compiled or interpreted)
    declared = {name for name, param in function.parameters.items() if "constexpr" in str(param.annotation)}
    if declared != set(constexprs):
        raise ValueError(f"the kernel's constexprs changed: {sorted(declared ^ set(constexprs))}")
    return constexprs


def mla_constexprs(heads: int, heads_per_program: int, tile: int, page: int, batch: int) -> dict[str, int | bool | str]:
    """The decode kernel's constexprs for MLA (576/512 latents, fixed variant) as
    decode_attention_fwd sets them by default (TMA copies for 64-head groups on pages the
    tiles divide) for a batch of ``batch`` sequences."""
    constexprs: dict[str, int | bool] = {
        "Q_PER_KV": heads, "HEADS_PER_PROGRAM": heads_per_program, "BLOCKS_PER_KV": -(-heads // heads_per_program),
        "BLOCK_H": max(16, triton.next_power_of_2(heads_per_program)), "QK_MAIN": 512, "QK_MAIN_PAD": 512,
        "QK_ROPE": 64, "QK_ROPE_PAD": 64, "V_DIM": 512, "V_PAD": 512, "PAGE_SIZE": page, "TILE": tile,
        "PAGES": _pages_a_tile_meets(page, tile), "V_IS_K_MAIN": True, "USE_LOGIT_CAP": False,
        "PAGE_OFFSET_INT64": True, "SEQS_PAD": schedule_lanes(batch, wide=heads_per_program > 32),
        "ROW_TMA": heads_per_program > 32 and _pages_a_tile_meets(page, tile) == 1, "MUTANT": "",
    }  # fmt: skip
    return _checked(_decode_split_kernel, constexprs)


def gqa_decode_constexprs(
    q_per_kv: int, head_size: int, block_size: int, tile: int, batch: int
) -> dict[str, int | bool]:
    """The unified kernel's constexprs for a split decode batch of ``batch`` sequences (one
    query a sequence, causal, fixed variant) as unified_attention sets them: the batch
    sets the schedule's vector width, SEQS_PAD, and with it the program's registers."""
    block_m, block_q = query_rows(q_per_kv)
    constexprs: dict[str, int | bool] = {
        "Q_PER_KV": q_per_kv, "BLOCK_SIZE": block_size, "TILE": tile, "HEAD_SIZE": head_size,
        "HEAD_PAD": max(16, triton.next_power_of_2(head_size)), "BLOCK_M": block_m, "BLOCK_Q": block_q,
        "CAUSAL": True, "WINDOW": 0, "USE_SOFTCAP": False, "SPLIT": True, "READ_PAST_SEQ_LEN": False,
        "SEQS_PAD": schedule_lanes(batch), "MUTANT": "",
    }  # fmt: skip
    return _checked(_unified_attention_kernel, constexprs)


def tile_buffers(ttgir: str) -> int:
    """How many shared-memory buffers the software pipeliner gave the loop's K/V tiles: the
    leading dimension of its multi-buffered 16-bit tile allocations (``ttg.local_alloc``
    without an operand), 0 where no tile load was pipelined. One buffer means the next tile's
    copies are issued only after the current tile's math, so a program overlaps nothing."""
    counts = re.findall(r"ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x\d+x\d+x(?:bf16|f16)", ttgir)
    return max((int(count) for count in counts), default=0)


def _compile(
    kernel: Any, constexprs: dict[str, int | bool | str], types: dict[str, str], num_warps: int, num_stages: int
) -> tuple[Any, str, str]:
    """``kernel`` compiled for sm_90: (the compiled kernel, cuobjdump's resource usage, its SASS)."""
    names = kernel.arg_names
    signature = {n: "constexpr" if n in constexprs else types.get(n, "fp32" if n in _FLOATS else "i32") for n in names}
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if signature[n] != "constexpr" and n not in _UNALIGNED
    }
    positions = {(names.index(n),): v for n, v in constexprs.items()}
    source = ASTSource(kernel, signature, constexprs=positions, attrs=aligned)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvcanary_kernel_{os.getpid()}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    try:
        tool = str(_TOOLS / "cuobjdump")
        usage, sass = (
            subprocess.run([tool, flag, str(cubin)], capture_output=True, text=True, check=True).stdout
            for flag in ("-res-usage", "-sass")
        )
    finally:
        cubin.unlink()
    return compiled, usage, sass


def sass_digest(sass: str) -> str:
    """A fingerprint of the machine code alone (instructions, no addresses or encodings): equal
    across commits when a change leaves the compiled kernel as it was."""
    instructions = [re.sub(r"/\*[^*]*\*/", "", line).strip() for line in sass.splitlines()
                    if re.match(r"\s*/\*[0-9a-f]{4}\*/", line)]  # fmt: skip
    return hashlib.sha256("\n".join(instructions).encode()).hexdigest()[:16]


def _report(
    kernel: Any, constexprs: dict[str, int | bool | str], types: dict[str, str], num_warps: int, num_stages: int
) -> str:
    """``kernel`` compiled for sm_90: registers, spill stack, local loads and stores in its
    machine code, shared memory, the K/V tiles' pipeline buffers, the kind of matrix
    instruction and the digest of its machine code."""
    compiled, usage, sass = _compile(kernel, constexprs, types, num_warps, num_stages)
    registers = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    local_loads, local_stores = (len(re.findall(rf"\b{op}\b", sass)) for op in ("LDL", "STL"))
    return (
        f"registers {registers.group(1) if registers else '?'}, spill stack {stack.group(1) if stack else '?'} B "
        f"({local_loads} local loads, {local_stores} stores), "
        f"shared {compiled.metadata.shared // 1024} KB, K/V buffers {tile_buffers(compiled.asm['ttgir'])}, "
        f"{'wgmma' if 'wgmma' in compiled.asm['ptx'] else 'mma.sync'}, SASS {sass_digest(sass)}"
    )


def mla_resources(
    heads: int, heads_per_program: int, tile: int, num_warps: int, num_stages: int, page: int, batch: int
) -> str:
    """One MLA decode configuration compiled for sm_90."""
    constexprs = mla_constexprs(heads, heads_per_program, tile, page, batch)
    # Whole tiles come as TMA copies where the tiles divide the page (decode_attention_fwd).
    descriptors = {"k_rows_desc": f"tensordesc<bf16[{tile},512]>", "rope_rows_desc": f"tensordesc<bf16[{tile},64]>"}
    if not constexprs["ROW_TMA"]:
        descriptors = {name: "*bf16" for name in descriptors}
    report = _report(_decode_split_kernel, constexprs, {**_POINTERS, **descriptors}, num_warps, num_stages)
    return report + (", TMA copies" if constexprs["ROW_TMA"] else "")


def gqa_decode_resources(
    q_per_kv: int, head_size: int, block_size: int, tile: int, num_warps: int, stages: int, batch: int
) -> str:
    """The unified kernel's split decode compiled for sm_90. vLLM's caches are contiguous
    along the head dimension, and Triton's JIT compiles an integer argument equal to 1 as
    that constant: the dimension strides are 1 here too."""
    constexprs = gqa_decode_constexprs(q_per_kv, head_size, block_size, tile, batch)
    unit_strides = {"stride_k_dim": 1, "stride_v_dim": 1}
    return _report(_unified_attention_kernel, {**constexprs, **unit_strides}, _POINTERS, num_warps, stages)


def main() -> None:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    print(f"Triton {triton.__version__}")
    print("MLA decode on sm_90: heads, heads a program, tile, warps, stages, page, batch")
    configs = [
        (16, 16, 64, 4, 2, 64, 256), (128, 64, 64, 8, 2, 64, 256), (128, 64, 64, 8, 2, 64, 8),
        (128, 64, 32, 8, 2, 64, 256), (128, 32, 64, 4, 2, 64, 256), (8, 8, 64, 4, 3, 480, 256),
        (8, 8, 32, 4, 3, 480, 256),
    ]  # fmt: skip
    for config in configs:
        print(config, mla_resources(*config), flush=True)
    print("GQA split decode (unified kernel) on sm_90: query heads a KV head, head, block, tile, warps, stages, batch")
    for batch in (8, 16, 32, 64, 256):
        gqa = (4, 128, 16, 64, 4, 2, batch)
        print(gqa, gqa_decode_resources(*gqa), flush=True)


if __name__ == "__main__":
    main()
