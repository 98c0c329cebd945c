"""vLLM 0.24's attention kernels without installing vLLM, for the kernel benchmark.

``make_vllm_ref`` fills a folder with the few files of a vLLM 0.24.0 wheel (or of an
unpacked ``vllm`` package folder) that the benchmark calls, beside stand-ins for the handful
of ``vllm`` modules those files import:

* vLLM's Triton kernels (sources): ``vllm/v1/attention/ops/triton_unified_attention.py`` (the
  kernel TRITON_ATTN calls), its helpers, and ``triton_decode_attention.py`` (TRITON_MLA);
* FlashAttention-3 (vLLM's FLASH_ATTN on Hopper): ``vllm/vllm_flash_attn/__init__.py``,
  ``flash_attn_interface.py`` and ``_vllm_fa3_C.abi3.so`` (not the FA2 library, 190 MB);
* FlashMLA (vLLM's FLASHMLA): ``vllm/_flashmla_C.abi3.so``, ``vllm/_flashmla_extension_C.abi3.so``
  and ``vllm/third_party/flashmla/``.

The compiled libraries link against the torch vLLM 0.24.0 pins (2.11, CUDA 13): on a host
with another torch they do not load, and the benchmark prints the reason instead of a peer.
``load_vllm`` and ``load_peers`` import them; ``vllm_unified_decode`` calls vLLM's unified
Triton kernel the way its TRITON_ATTN backend does.
"""

import importlib
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

TRITON_SOURCES = (
    "v1/attention/ops/triton_unified_attention.py",
    "v1/attention/ops/triton_attention_helpers.py",
    "v1/attention/ops/triton_decode_attention.py",
)
FA3_FILES = (
    "vllm_flash_attn/__init__.py",
    "vllm_flash_attn/flash_attn_interface.py",
    "vllm_flash_attn/_vllm_fa3_C.abi3.so",
)
FLASHMLA_FILES = (
    "_flashmla_C.abi3.so",
    "_flashmla_extension_C.abi3.so",
    "third_party/__init__.py",
    "third_party/flashmla/__init__.py",
    "third_party/flashmla/flash_mla_interface.py",
)
REF_FILES = TRITON_SOURCES + FA3_FILES + FLASHMLA_FILES

# Stand-ins for the vllm modules the files above import (paths inside the vllm package).
STAND_INS = {
    "__init__.py": "",
    "envs.py": "VLLM_BATCH_INVARIANT = False\n",
    "logger.py": "import logging\n\ninit_logger = logging.getLogger\n",
    "triton_utils/__init__.py": "import triton\nimport triton.language as tl\n",
    "platforms/__init__.py": (
        "import torch\n\n\nclass _Cuda:\n"
        "    def fp8_dtype(self):\n        return torch.float8_e4m3fn\n\n"
        "    def is_rocm(self):\n        return False\n\n"
        "    def is_cuda(self):\n        return True\n\n"
        "    def has_device_capability(self, capability):\n"
        "        major, minor = torch.cuda.get_device_capability()\n"
        "        return major * 10 + minor >= capability\n\n"
        "    def is_device_capability_family(self, family):\n"
        "        return torch.cuda.get_device_capability()[0] * 10 == family\n\n\n"
        "current_platform = _Cuda()\n"
    ),
    "v1/__init__.py": "",
    "v1/attention/__init__.py": "",
    "v1/attention/ops/__init__.py": "",
    "v1/kv_cache_interface.py": (
        "from enum import IntEnum\n\n\nclass KVQuantMode(IntEnum):\n"
        "    NONE = 0\n    FP8_PER_TENSOR = 1\n    INT8_PER_TOKEN_HEAD = 2\n    FP8_PER_TOKEN_HEAD = 3\n"
    ),
}


def _reader(source: str) -> Callable[[str], bytes]:
    """Bytes of a file given by its path inside the vllm package, from a wheel or from an
    unpacked package (the ``vllm`` folder itself or the folder that holds it)."""
    path = Path(source)
    if path.is_file():
        archive = zipfile.ZipFile(path)
        return lambda name: archive.read("vllm/" + name)
    package = path if (path / "v1").is_dir() else path / "vllm"
    if not (package / "v1").is_dir():
        raise FileNotFoundError(f"{source}: neither a vLLM wheel nor a vllm package folder (no v1/ inside)")
    return lambda name: (package / name).read_bytes()


def make_vllm_ref(source: str, folder: str) -> list[str]:
    """Fill ``folder`` with the stand-ins and the files of REF_FILES read from ``source``
    (a wheel, e.g. from ``pip download vllm==0.24.0 --no-deps``, or an unpacked vllm
    package). Returns the files that ``source`` lacks: their peer is then unavailable."""
    read = _reader(source)
    root = Path(folder) / "vllm"
    for name, text in STAND_INS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    missing = []
    for name in REF_FILES:
        try:
            data = read(name)
        except (KeyError, FileNotFoundError):
            missing.append(name)
            continue
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return missing


def _on_path(ref_dir: str) -> None:
    resolved = str(Path(ref_dir).resolve())
    if resolved not in sys.path:
        sys.path.insert(0, resolved)


def load_vllm(ref_dir: str | None) -> tuple[ModuleType | None, ModuleType | None, str]:
    """vLLM 0.24.0's unified and decode Triton modules from ``ref_dir``, or why they are unavailable."""
    if not ref_dir or not Path(ref_dir).is_dir():
        return None, None, "no vLLM sources given (--vllm-ref)"
    _on_path(ref_dir)
    try:
        unified = importlib.import_module("vllm.v1.attention.ops.triton_unified_attention")
        decode = importlib.import_module("vllm.v1.attention.ops.triton_decode_attention")
    except Exception as exc:  # any import failure means: no vLLM ratio, say why
        return None, None, f"vLLM kernels did not import: {exc!r}"
    return unified, decode, "vLLM 0.24.0 Triton kernels"


@dataclass
class Peers:
    """FA3's and FlashMLA's Python interfaces from vLLM 0.24.0, or why each is unavailable."""

    fa3: ModuleType | None
    flashmla: ModuleType | None
    fa3_note: str
    flashmla_note: str


def load_peers(ref_dir: str | None) -> Peers:
    if not ref_dir or not Path(ref_dir).is_dir():
        note = "no vLLM files given (--vllm-ref)"
        return Peers(None, None, note, note)
    _on_path(ref_dir)
    fa3: ModuleType | None = None
    try:
        fa3 = importlib.import_module("vllm.vllm_flash_attn.flash_attn_interface")
        fa3_note = "FA3 from vLLM 0.24.0"
        if not fa3.FA3_AVAILABLE:
            fa3, fa3_note = None, f"FA3 unavailable: {fa3.FA3_UNAVAILABLE_REASON}"
        elif not fa3.is_fa_version_supported(3):
            fa3, fa3_note = None, f"FA3 unsupported here: {fa3.fa_version_unsupported_reason(3)}"
    except Exception as exc:  # any failure means: no FA3 column, say why
        # The package's __init__ hides why the library did not load; the interface kept it.
        interface = sys.modules.get("vllm.vllm_flash_attn.flash_attn_interface")
        fa3, fa3_note = None, f"FA3 did not import: {getattr(interface, 'FA3_UNAVAILABLE_REASON', None) or repr(exc)}"
    flashmla: ModuleType | None = None
    try:
        flashmla = importlib.import_module("vllm.third_party.flashmla.flash_mla_interface")
        flashmla_note = "FlashMLA from vLLM 0.24.0"
    except Exception as exc:  # any failure means: no FlashMLA column, say why
        flashmla, flashmla_note = None, f"FlashMLA did not import: {exc!r}"
    return Peers(fa3, flashmla, fa3_note, flashmla_note)


def vllm_unified_decode(
    vllm_unified: ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    cu: torch.Tensor,
    lens: torch.Tensor,
    max_len: int,
    scale: float,
    table: torch.Tensor,
) -> Callable[[], None]:
    """vLLM 0.24's unified Triton kernel called as its TRITON_ATTN backend calls it for a
    decode batch: the 3D (split) path below 128 / kv_heads sequences, 16 softmax segments,
    layer scales of 1."""
    q_heads, head = q.shape[1:]
    kv_heads = k.shape[2]
    segments, threshold = 16, 128 // kv_heads
    segm_out = torch.empty(threshold, q_heads, segments, head, device=q.device)
    segm_max = torch.empty(threshold, q_heads, segments, device=q.device)
    segm_sum = torch.empty_like(segm_max)
    ones = torch.ones(lens.shape[0], kv_heads, device=q.device)
    return lambda: vllm_unified.unified_attention(
        q=q, k=k, v=v, out=out, cu_seqlens_q=cu, max_seqlen_q=1, seqused_k=lens, max_seqlen_k=max_len,
        softmax_scale=scale, causal=True, window_size=(-1, -1), block_table=table, softcap=0.0,
        q_descale=None, k_descale=ones, v_descale=ones, seq_threshold_3D=threshold,
        num_par_softmax_segments=segments, softmax_segm_output=segm_out, softmax_segm_max=segm_max,
        softmax_segm_expsum=segm_sum,
    )  # fmt: skip
