"""vLLM's own lm-eval configs (copied into tests/data) become the profiles they should."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.profile_catalog import load_catalog
from service.profiles import ProfileError
from service.settings import Settings
from service.vllm_configs import DEFAULT_RTOL, config_files, load_configs, read_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "vllm-configs"


def test_a_gsm8k_config_keeps_model_tasks_limits_and_vllm_rule() -> None:
    config = read_config(CONFIGS / "Meta-Llama-3-8B-Instruct.yaml", tensor_parallel_size=2)
    profile = config.profile
    assert profile.name == "meta-llama-3-8b-instruct"
    assert profile.model == profile.served_model_name == "meta-llama/Meta-Llama-3-8B-Instruct"
    # vLLM's harness defaults: max_model_len 4096, enforce_eager true; TP from --tp-size.
    assert (profile.engine.max_model_len, profile.engine.enforce_eager) == (4096, True)
    assert profile.engine.tensor_parallel_size == 2 and not profile.engine.trust_remote_code
    suite = profile.suite_configs()["lm-eval"]
    assert (suite.limit, suite.num_fewshot) == (250, 5)
    assert suite.metric_names() == ("gsm8k:exact_match,strict-match", "gsm8k:exact_match,flexible-extract")
    strict = profile.baselines["lm-eval"]["gsm8k:exact_match,strict-match"]
    assert (strict.value, strict.direction) == (0.756, "higher")
    assert (strict.tolerance.kind, strict.tolerance.value) == ("relative", DEFAULT_RTOL)
    assert "Meta-Llama-3-8B-Instruct.yaml" in strict.source and "rtol 0.08" in strict.source
    assert profile.baselines["lm-eval"]["gsm8k:exact_match,flexible-extract"].value == 0.752
    assert config.notes == ()


def test_engine_settings_env_and_lm_eval_arguments_as_the_files_use_them() -> None:
    nemotron = read_config(CONFIGS / "NVIDIA-Nemotron-3-Nano-30B-A3B-FP8.yaml").profile
    assert nemotron.engine.max_model_len == 262144 and nemotron.engine.trust_remote_code
    assert nemotron.engine.enforce_eager is False
    assert nemotron.engine.kv_cache_dtype == "fp8" and nemotron.engine.extra_args == []
    assert nemotron.engine.env == {"VLLM_USE_FLASHINFER_MOE_FP8": "1", "VLLM_FLASHINFER_MOE_BACKEND": "throughput"}
    suite = nemotron.suite_configs()["lm-eval"]
    assert suite.apply_chat_template and suite.fewshot_as_multiturn and suite.limit == 1319

    qwen = read_config(CONFIGS / "Qwen3-8B.yaml").profile
    qwen_suite = qwen.suite_configs()["lm-eval"]
    assert qwen_suite.gen_kwargs == "top_p=1,top_k=0,max_gen_toks=1536" and qwen.engine.max_model_len == 8096
    assert qwen.baselines["lm-eval"]["mmlu_pro:exact_match,custom-extract"].value == 0.60

    gpt = read_config(CONFIGS / "gpt-oss-120b.yaml").profile
    assert gpt.suite_configs()["lm-eval"].num_fewshot == 0 and gpt.engine.trust_remote_code

    ruler = read_config(CONFIGS / "C4-25a218t-FP8-ruler-4k.yaml")
    assert ruler.profile.suite_configs()["lm-eval"].metadata == {"max_seq_lengths": [4096]}
    assert ruler.profile.suite_configs()["lm-eval"].num_fewshot is None


def test_keys_not_applied_are_reported_by_file_key_and_reason(tmp_path: Path) -> None:
    amd = read_config(CONFIGS / "DeepSeek-V4-Flash-MXFP4.yaml")
    assert amd.profile.engine.kv_cache_dtype == "fp8"
    assert amd.profile.engine.extra_args == ["--moe-backend", "aiter", "--tokenizer-mode", "deepseek_v4"]
    assert [(n.file.name, n.key) for n in amd.notes] == [("DeepSeek-V4-Flash-MXFP4.yaml", "required_gpu_arch")]
    odd = tmp_path / "Odd.yaml"
    odd.write_text((CONFIGS / "Meta-Llama-3-8B-Instruct.yaml").read_text() + "rtoll: 0.1\nbatch_size: auto\n")
    notes = {n.key: n.reason for n in read_config(odd).notes}
    assert notes["rtoll"].startswith("unknown") and notes["batch_size"].startswith("not applied")
    assert read_config(odd).profile.baselines["lm-eval"]["gsm8k:exact_match,strict-match"].tolerance.value == 0.08


def test_a_folder_loads_every_config_and_reports_the_ones_it_cannot_serve() -> None:
    with pytest.raises(ProfileError, match="vllm-vlm"):
        read_config(CONFIGS / "Qwen2.5-VL-7B-Instruct.yaml")
    found, problems = load_configs([CONFIGS])
    assert "qwen2.5-vl-7b-instruct" not in found and any("Qwen2.5-VL-7B-Instruct.yaml" in p for p in problems)
    assert len(found) == len(list(CONFIGS.glob("*.yaml"))) - 1 == 11 - 1


def test_own_rtol_and_missing_keys(tmp_path: Path) -> None:
    strict = tmp_path / "Strict.yaml"
    strict.write_text((CONFIGS / "Meta-Llama-3-8B-Instruct.yaml").read_text() + "rtol: 0.02\n")
    rule = read_config(strict).profile.baselines["lm-eval"]["gsm8k:exact_match,strict-match"].tolerance
    assert (rule.kind, rule.value) == ("relative", 0.02)
    broken = tmp_path / "Broken.yaml"
    broken.write_text("tasks: []\n")
    with pytest.raises(ProfileError, match="model_name: missing"):
        read_config(broken)


def test_a_models_list_names_its_configs_and_settings_split_folders(tmp_path: Path) -> None:
    listed = [p.name for p in config_files(CONFIGS / "models-large.txt")]
    assert listed == [
        "Meta-Llama-3-70B-Instruct.yaml",
        "Mixtral-8x7B-Instruct-v0.1.yaml",
        "Qwen2-57B-A14-Instruct.yaml",
    ]
    settings = Settings(
        vllm_configs=f"{CONFIGS / 'models-large.txt'}:{CONFIGS / 'Qwen3-8B.yaml'}",  # type: ignore[arg-type]
        vllm_tensor_parallel_size=4,
        data_dir=tmp_path,
    )
    catalog = load_catalog(settings)
    assert set(catalog.vllm) == {
        "meta-llama-3-70b-instruct", "mixtral-8x7b-instruct-v0.1", "qwen2-57b-a14-instruct", "qwen3-8b",
    }  # fmt: skip
    assert catalog.profiles["qwen3-8b"].engine.tensor_parallel_size == 4
    assert "gsm8k-tiny-cpu" in catalog.profiles  # the service's own profiles stay


def test_profiles_show_prints_how_a_file_was_understood(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVCANARY_VLLM_CONFIGS", str(CONFIGS))
    from service.settings import get_settings

    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["profiles", "show", "DeepSeek-V4-Flash-MXFP4"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert "source: vLLM lm-eval config" in result.output and "DeepSeek-V4-Flash-MXFP4.yaml" in result.output
    assert "moe_backend -> engine.extra_args --moe-backend aiter" in result.output
    assert "required_gpu_arch: not applied" in result.output
    assert "gsm8k:exact_match,strict-match" in result.output


def test_shipped_whisper_profiles_carry_published_baselines() -> None:
    from evals.verdict import Baseline, threshold
    from service.profiles import load_profiles
    from service.settings import PACKAGED_PROFILES

    profiles = load_profiles(PACKAGED_PROFILES)
    earnings = profiles["whisper-large-v3-earnings22"]
    source = earnings.suite_configs()["wer"]
    assert (source.hub_path, source.split) == ("D4nt3/esb-datasets-earnings22-validation-tiny-filtered", "validation")
    wer = earnings.baselines["wer"]["wer"]
    assert wer.value == 0.1274498 and "test_transcription_api_correctness.py" in wer.source
    # vLLM: assert_close(wer_percent, 12.744980, atol=0.1, rtol=0.01); kvcanary keeps the upper side.
    rule = Baseline(wer.value, wer.direction, wer.tolerance.kind, wer.tolerance.value)
    assert threshold(rule) == pytest.approx((12.744980 + 0.1 + 0.01 * 12.744980) / 100, abs=1e-6)
    librispeech = profiles["whisper-large-v3"].baselines["wer"]["wer"]
    assert librispeech.value == 0.0201 and "Open ASR Leaderboard" in librispeech.source


def test_the_service_serves_vllm_configs_as_profiles_with_their_baselines(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    settings = Settings(
        data_dir=tmp_path / "data",
        profiles_dir=profiles,
        start_worker=False,
        vllm_configs=[CONFIGS / "models-large.txt"],
    )
    with TestClient(create_app(settings)) as client:
        names = {p["name"] for p in client.get("/api/v1/profiles").json()}
        assert names == {"meta-llama-3-70b-instruct", "mixtral-8x7b-instruct-v0.1", "qwen2-57b-a14-instruct"}
        seeded = client.get("/api/v1/baselines", params={"profile": "mixtral-8x7b-instruct-v0.1"}).json()
    rows = {b["metric"]: b for b in seeded}
    assert set(rows) == {"gsm8k:exact_match,strict-match", "gsm8k:exact_match,flexible-extract"}
    strict = rows["gsm8k:exact_match,strict-match"]
    assert (strict["value"], strict["tolerance_kind"], strict["tolerance"]) == (0.616, "relative", 0.08)
