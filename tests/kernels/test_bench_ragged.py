"""The kernel benchmark's CPU parts: the ragged batches' length mixes and block tables, the
row arithmetic and the table (scripts/gpu/ragged_batches.py), and the vLLM reference folder
built from a wheel or an unpacked package (scripts/gpu/vllm_ref.py). The GPU timings
themselves run on a GPU host (scripts/gpu/kernel_tests.sh)."""

import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from kernel_resources import gqa_decode_constexprs, mla_constexprs, tile_buffers
from ragged_batches import (
    MISSING,
    TABLE_SLACK,
    RaggedCase,
    format_ragged_table,
    format_sweep,
    lognormal_lengths,
    ragged_cases,
    ragged_page_table,
    ragged_row,
    range_lengths,
    sweep_configs,
)
from vllm_ref import REF_FILES, STAND_INS, load_peers, make_vllm_ref


def test_lognormal_lengths_have_the_stated_median_and_tail() -> None:
    lengths = lognormal_lengths(20000, seed=7)
    ordered = sorted(lengths)
    assert 1900 <= ordered[len(ordered) // 2] <= 2200
    assert 29000 <= ordered[int(0.99 * len(ordered))] <= 36000
    assert min(lengths) >= 16 and max(lengths) <= 65536
    assert lognormal_lengths(64, seed=64) == lognormal_lengths(64, seed=64)
    assert lognormal_lengths(64, seed=64) != lognormal_lengths(64, seed=65)


def test_lognormal_lengths_are_clipped() -> None:
    lengths = lognormal_lengths(500, seed=1, clip=(1000, 4000))
    assert min(lengths) == 1000 and max(lengths) == 4000


def test_range_lengths_stay_in_range() -> None:
    lengths = range_lengths(1000, seed=3, low=1024, high=16384)
    assert min(lengths) >= 1024 and max(lengths) <= 16384
    assert len(set(lengths)) > 900


def test_cases_cover_the_issue_rows() -> None:
    cases = {c.name: c for c in ragged_cases()}
    gqa48 = cases["gqa 48 ragged 1k-16k 64q/8kv"]
    assert (len(gqa48.lengths), gqa48.q_heads, gqa48.kv_heads, gqa48.peer) == (48, 64, 8, "FA3")
    assert cases["gqa 64x8k uniform 32q/8kv"].lengths == (8192,) * 64
    assert cases["gqa 16x1.5k uniform 32q/8kv"].lengths == (1536,) * 16  # a small batch of short sequences
    assert cases["mla 32 ragged 1k-8k 128h p64"].report_flops
    assert cases["mla 64 ragged 2k-16k 8h p480"].peer is None
    assert cases["mla 128x4k uniform 16h p64"].peer == "FlashMLA"
    assert [len(c.lengths) for c in cases.values() if "lognormal" in c.name] == [8, 16, 64, 256, 32, 64, 128]
    smoke = ragged_cases(smoke=True)
    assert {c.peer for c in smoke} == {"FA3", "FlashMLA", None}
    assert any(c.report_flops for c in smoke) and sum(sum(c.lengths) for c in smoke) < 20000


def test_bytes_and_flops() -> None:
    gqa = RaggedCase("g", "gqa", (100, 300), q_heads=32, kv_heads=8)
    assert gqa.kv_bytes == 2 * 400 * 8 * 128 * 2
    assert gqa.flops == 2 * 400 * 32 * 256
    mla = RaggedCase("m", "mla", (1000,), q_heads=128, page=64)
    assert mla.kv_bytes == 1000 * 576 * 2
    assert mla.flops == 2 * 1000 * 128 * (576 + 512)


def test_page_table_gives_each_sequence_its_own_pages() -> None:
    lengths = (1, 64, 65, 480, 1000)
    table, num_pages = ragged_page_table(lengths, 64, torch.Generator().manual_seed(0))
    counts = [1, 1, 2, 8, 16]
    assert num_pages == sum(counts) and table.dtype == torch.int32
    assert table.shape == (5, 16 + TABLE_SLACK)
    used = torch.cat([table[row, :count] for row, count in enumerate(counts)])
    assert sorted(used.tolist()) == list(range(num_pages))
    assert all(int(table[row, count:].abs().sum()) == 0 for row, count in enumerate(counts))


def test_row_ratios_and_table() -> None:
    case = RaggedCase("mla many heads", "mla", (1000, 3000), q_heads=128, page=64, report_flops=True)
    copy_bps = 4e12
    ms = {"fixed": 0.010, "legacy": 0.011, "vllm": 0.040, "peer": 0.008}
    row = ragged_row(case, ms, {"fixed": 2e-3, "peer": 3e-3}, copy_bps, {"vllm_error": "boom"})
    assert math.isclose(row["fixed_of_copy"], case.kv_bytes / 1e-5 / copy_bps)
    assert math.isclose(row["fixed_over_legacy"], 10 / 11)
    assert math.isclose(row["ours_over_peer"], 1.25)
    assert math.isclose(row["ours_over_vllm"], 0.25)
    assert math.isclose(row["peer_tflops"], case.flops / 8e-6 * 1e-12)
    no_peer = ragged_row(RaggedCase("p480", "mla", (5000,), 8, page=480), {"fixed": 0.02, "legacy": 0.02}, {}, 4e12, {})
    assert "ours_over_peer" not in no_peer and no_peer["peer"] is None
    lines = format_ragged_table([row, no_peer, {"case": "broken", "error": "RuntimeError('x')"}]).splitlines()
    assert lines[0].startswith("case") and "ours/peer" in lines[0]
    assert "mla many heads" in lines[1] and "1.250" in lines[1] and "FlashMLA" in lines[1]
    assert f"{100 * row['fixed_of_copy']:.1f}" in lines[1] and f"{row['fixed_tflops']:.0f}" in lines[1]
    assert f"{case.kv_bytes * 1e-6:.0f}" in lines[1] and f"{row['vllm_tflops']:.0f}" in lines[1]
    assert "p480" in lines[2] and lines[2].count(MISSING) >= 6
    assert "error: RuntimeError('x')" in lines[3]


def _write_fake_package(root: Path) -> None:
    for name in REF_FILES:
        (root / "vllm" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "vllm" / name).write_bytes(name.encode())


@pytest.mark.parametrize("form", ["wheel", "package", "parent"])
def test_make_vllm_ref_copies_every_file_beside_the_stand_ins(tmp_path: Path, form: str) -> None:
    _write_fake_package(tmp_path / "src")
    source = tmp_path / "src"
    if form == "wheel":
        source = tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl"
        with zipfile.ZipFile(source, "w") as wheel:
            for name in REF_FILES[1:]:  # a wheel that lacks one file
                wheel.write(tmp_path / "src" / "vllm" / name, "vllm/" + name)
    elif form == "package":
        source = tmp_path / "src" / "vllm"
    missing = make_vllm_ref(str(source), str(tmp_path / "ref"))
    present = REF_FILES[1:] if form == "wheel" else REF_FILES
    assert missing == ([REF_FILES[0]] if form == "wheel" else [])
    for name in present:
        assert (tmp_path / "ref" / "vllm" / name).read_bytes() == name.encode()
    for name in STAND_INS:
        assert (tmp_path / "ref" / "vllm" / name).is_file()


def test_make_vllm_ref_refuses_a_folder_without_vllm(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither a vLLM wheel nor a vllm package"):
        make_vllm_ref(str(tmp_path), str(tmp_path / "ref"))


def test_stand_ins_import_and_missing_peers_are_explained(tmp_path: Path) -> None:
    """The stand-in package imports, and peers whose files are absent are reported with a
    reason instead of failing the benchmark (in a child: the stand-in takes the name vllm)."""
    ref_dir = tmp_path / "ref"
    for name, text in STAND_INS.items():
        (ref_dir / "vllm" / name).parent.mkdir(parents=True, exist_ok=True)
        (ref_dir / "vllm" / name).write_text(text)
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / 'scripts' / 'gpu')!r})\n"
        "from vllm_ref import load_peers\n"
        f"peers = load_peers({str(ref_dir)!r})\n"
        "import vllm.platforms, vllm.envs, vllm.logger, vllm.v1.kv_cache_interface\n"
        "assert vllm.platforms.current_platform.is_cuda()\n"
        "print(peers.fa3 is None, peers.flashmla is None)\n"
        "print(peers.fa3_note)\nprint(peers.flashmla_note)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, fa3_note, flashmla_note = done.stdout.splitlines()
    assert first == "True True"
    assert fa3_note.startswith("FA3 did not import") and "vllm_flash_attn" in fa3_note
    assert flashmla_note.startswith("FlashMLA did not import") and "third_party" in flashmla_note
    assert load_peers(None).fa3_note == "no vLLM files given (--vllm-ref)"


def test_the_sweep_varies_the_work_items_and_many_head_groups() -> None:
    gqa = RaggedCase("g", "gqa", (100, 2000), 32, 8)  # long enough for split decode
    assert sweep_configs(gqa, 132)["no split"].num_splits == 1
    assert sweep_configs(gqa, 132)["items*2"].num_splits == 4 * sweep_configs(gqa, 132)["items/2"].num_splits
    assert sweep_configs(gqa, 132)["tile 32"].tile == 32
    assert sweep_configs(gqa, 132)["stages 3"].num_stages == 3  # split GQA decode runs 2 stages
    narrow = RaggedCase("m", "mla", (100,), 16, page=64)
    assert set(sweep_configs(narrow, 132)) == {
        "items/2", "items*1.5", "items*2", "tile 32", "warps 8", "stages 3", "tile 32 stages 3", "tma",
    }  # fmt: skip
    assert sweep_configs(narrow, 132)["tma"].row_tma is True
    page480 = sweep_configs(RaggedCase("k", "mla", (100,), 8, page=480), 132)
    assert page480["tile 32"].tile == 32 and page480["stages 2"].num_stages == 2
    assert "tma" not in page480  # 64-key tiles do not divide 480-token pages
    wide = sweep_configs(RaggedCase("w", "mla", (100,), 128, page=64), 132)
    assert wide["heads 32"].heads_per_program == 32 and wide["tile 32"].tile == 32
    assert wide["warps 16"].num_warps == 16 and wide["pointer loads"].row_tma is False
    assert wide["items/2"].num_splits == 66  # 132 multiprocessors over two 64-head groups
    line = format_sweep({"case": "w", "sweep_ms": {"default": 0.5, "heads 32": 0.25}})
    assert line == "  w: default 0.500 ms; heads 32 0.250 ms (0.50x)"
    assert format_sweep({"case": "w"}) == ""


def test_the_resource_script_sets_every_constexpr_of_both_kernels() -> None:
    """scripts/kernel_resources.py compiles the kernels for sm_90 with constexprs of its own: a
    renamed constexpr must fail here, not in the script (it once did, silently stale)."""
    gqa = gqa_decode_constexprs(4, 128, 16, 64, 16)  # 32 query and 8 KV heads, a batch of 16
    assert gqa["SPLIT"] and (gqa["BLOCK_M"], gqa["BLOCK_Q"], gqa["SEQS_PAD"]) == (16, 4, 32)
    assert gqa_decode_constexprs(4, 80, 16, 64, 100)["HEAD_PAD"] == 128
    assert gqa_decode_constexprs(4, 128, 16, 64, 100)["SEQS_PAD"] == 128

    assert mla_constexprs(128, 64, 64, 64, 256)["PAGES"] == 1
    assert mla_constexprs(8, 8, 64, 480, 256)["PAGES"] == 2
    # As decode_attention_fwd's default: TMA copies for 64-head groups on pages tiles divide.
    assert mla_constexprs(128, 64, 64, 64, 256)["ROW_TMA"] and not mla_constexprs(16, 16, 64, 64, 256)["ROW_TMA"]
    # Wide schedule vectors for 64-head groups only.
    assert mla_constexprs(128, 64, 64, 64, 8)["SEQS_PAD"] == 32 and mla_constexprs(16, 16, 64, 64, 8)["SEQS_PAD"] == 8


def test_the_resource_script_counts_the_pipelined_tiles_buffers() -> None:
    """K/V buffers: the leading dimension of the loop's multi-buffered 16-bit tiles, not the
    block table's page ids or an operand copied to shared memory (the queries)."""
    pipelined = (
        "%q_1 = ttg.local_alloc %q : (tensor<16x128xbf16, #blocked>) -> !ttg.memdesc<16x128xbf16, #shared, #smem>\n"
        "%block = ttg.local_alloc : () -> !ttg.memdesc<2x64xi32, #shared1, #smem, mutable>\n"
        "%k = ttg.local_alloc : () -> !ttg.memdesc<2x64x128xbf16, #shared, #smem, mutable>\n"
        "%v = ttg.local_alloc : () -> !ttg.memdesc<3x64x128xf16, #shared, #smem, mutable>\n"
    )
    assert tile_buffers(pipelined) == 3
    assert tile_buffers(pipelined.replace("3x64x128xf16", "1x64x128xf16").replace("2x64x128", "1x64x128")) == 1
    assert tile_buffers("%0 = tt.load %ptrs : tensor<64x128x!tt.ptr<bf16>>") == 0
