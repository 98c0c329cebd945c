"""The spoken clips are what Whisper expects, byte-identical across builds, and cached."""

from __future__ import annotations

import json
from pathlib import Path

import soundfile

from evals.fixtures import speech


def test_clips_are_16k_mono_pcm16_with_their_sentences(tmp_path: Path) -> None:
    manifest = speech.ensure_clips(tmp_path / "clips")
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert len(rows) >= 20
    assert [row["text"] for row in rows] == list(speech.SENTENCES)
    assert len({row["id"] for row in rows}) == len(rows)
    for row in rows:
        info = soundfile.info(str(manifest.parent / row["audio"]))
        assert (info.samplerate, info.channels, info.subtype, info.format) == (16000, 1, "PCM_16", "WAV")
        assert 1.0 < info.duration < 10.0, row


def test_builds_are_identical_and_cached(tmp_path: Path) -> None:
    first = speech.ensure_clips(tmp_path / "a")
    second = speech.ensure_clips(tmp_path / "b")
    names = sorted(p.name for p in first.parent.iterdir())
    assert names == sorted(p.name for p in second.parent.iterdir())
    for name in names:
        assert (first.parent / name).read_bytes() == (second.parent / name).read_bytes(), name
    stamp = first.stat().st_mtime_ns
    assert speech.ensure_clips(tmp_path / "a") == first
    assert first.stat().st_mtime_ns == stamp
    (first.parent / "clip-03.wav").unlink()
    speech.ensure_clips(tmp_path / "a")
    assert (first.parent / "clip-03.wav").read_bytes() == (second.parent / "clip-03.wav").read_bytes()
