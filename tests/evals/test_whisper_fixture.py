"""The converted tiny.en must behave exactly like the CTranslate2 model it was built from."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from evals.fixtures import speech, whisper_tiny

CLIPS = ("clip-01", "clip-07")  # an easy sentence and one tiny.en gets badly wrong


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return whisper_tiny.ensure_model()


@pytest.fixture(scope="module")
def manifest() -> Path:
    from evals.fixtures.cache import cache_dir

    return speech.ensure_clips(cache_dir() / "speech-clips")


def _features(manifest: Path, clip: str, checkpoint: Path) -> np.ndarray:
    from transformers import WhisperFeatureExtractor

    audio, rate = soundfile.read(manifest.parent / f"{clip}.wav", dtype="float32")
    extractor = WhisperFeatureExtractor.from_pretrained(checkpoint)
    features: np.ndarray = extractor(audio, sampling_rate=rate, return_tensors="np").input_features
    return features


def test_transformers_transcribes_like_ctranslate2(checkpoint: Path, manifest: Path) -> None:
    """Same encoder output (to fp16 rounding) and the same greedy tokens, clip by clip."""
    import ctranslate2
    import torch
    from transformers import WhisperForConditionalGeneration

    torch.set_num_threads(1)
    model = WhisperForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    original = ctranslate2.models.Whisper(
        str(whisper_tiny.source_dir()), device="cpu", compute_type="float32", intra_threads=1
    )
    prompt = [model.generation_config.decoder_start_token_id, model.generation_config.no_timestamps_token_id]
    for clip in CLIPS:
        features = _features(manifest, clip, checkpoint)
        with torch.no_grad():
            ours = model.model.encoder(torch.from_numpy(features)).last_hidden_state.numpy()
            generated = model.generate(torch.from_numpy(features), max_new_tokens=96)[0].tolist()
        view = ctranslate2.StorageView.from_array(features)
        theirs = np.array(original.encode(view, to_cpu=True))
        assert np.abs(ours - theirs).max() < 1e-3, clip
        reference = original.generate(view, [prompt], beam_size=1, max_length=96 + len(prompt))[0]
        eot = model.generation_config.eos_token_id
        assert [t for t in generated if t not in (*prompt, eot)] == reference.sequences_ids[0], clip
        assert len(reference.sequences_ids[0]) > 3, f"{clip}: the original model said almost nothing"


def test_tokenizer_holds_timestamps_and_prompt_tokens(checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    assert len(tokenizer) == config["vocab_size"] == 51864
    ids = tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>", "<|0.00|>", "<|30.00|>"])
    assert ids == [config["decoder_start_token_id"], 50362, 50363, 51863]
    assert tokenizer.decode([50257, 50362, 4222, 1969, 50256], skip_special_tokens=True) == " Please close"


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_conversion_is_deterministic(tmp_path: Path) -> None:
    source = whisper_tiny.source_dir()
    whisper_tiny.convert(source, tmp_path / "a")
    whisper_tiny.convert(source, tmp_path / "b")
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")
    assert set(_digests(tmp_path / "a")) == set(whisper_tiny.CHECKPOINT_FILES)


def test_cached_build_is_reused_and_a_broken_one_rebuilt(tmp_path: Path) -> None:
    built = whisper_tiny.ensure_model(tmp_path)
    weights = built / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert whisper_tiny.ensure_model(tmp_path) == built
    assert weights.stat().st_mtime_ns == stamp
    receipt = built / whisper_tiny.RECEIPT_NAME
    stale: dict[str, Any] = {**json.loads(receipt.read_text()), "source_sha256": "0" * 64}
    receipt.write_text(json.dumps(stale))
    assert whisper_tiny.ensure_model(tmp_path) == built
    assert json.loads(receipt.read_text())["source_sha256"] != "0" * 64
    (built / "tokenizer.json").unlink()
    whisper_tiny.ensure_model(tmp_path)
    assert (built / "tokenizer.json").is_file()
