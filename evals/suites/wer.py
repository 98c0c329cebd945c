"""Whisper word error rate through vLLM's `/v1/audio/transcriptions`.

Each clip goes to the server as a multipart upload, at most `concurrency` at a time, each
retried by the project's one rule (evals.retry: transport errors, 408, 429 and 5xx, after
Retry-After where the server sends it). References and hypotheses both pass through
Whisper's EnglishTextNormalizer (with Whisper's British-to-American spelling map), and the
corpus WER is jiwer's over the normalised pairs. An empty transcript counts as all deletions
and in `empty_response_rate`: an engine that answers 200 with no text must not look fine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import model_validator

from evals import pool, retry, stats
from evals.kinds import wer as kind
from evals.records import MetricValue, Sample
from evals.suites.base import MetricSpec, SuiteAborted, SuiteConfig, SuiteContext, SuiteDefinition, SuiteOutcome

BACKOFF_S = 0.5
BACKOFF_CAP_S = 8.0


class WerConfig(SuiteConfig):
    """The dataset is either a local manifest or a `datasets` hub id (with config and split).

    A manifest is JSONL, one `{"audio": <path relative to the manifest>, "text": <reference>}`
    a line, with an optional `"id"`. A hub dataset needs only its audio and text columns.
    """

    manifest: Path | None = None
    hub_path: str | None = None
    hub_name: str | None = None
    split: str = "test"
    revision: str | None = None
    audio_column: str = "audio"
    text_column: str = "text"
    id_column: str | None = "id"
    language: str = "en"
    temperature: float = 0.0

    @model_validator(mode="after")
    def _one_source(self) -> WerConfig:
        if (self.manifest is None) == (self.hub_path is None):
            raise ValueError("wer: set exactly one of `manifest` (a local JSONL) and `hub_path` (a dataset id)")
        return self


@dataclass(frozen=True)
class Utterance:
    key: str
    filename: str
    audio: bytes
    reference: str

    @property
    def audio_hash(self) -> str:
        return hashlib.sha256(self.audio).hexdigest()


def load_utterances(config: WerConfig) -> tuple[list[Utterance], int]:
    """The (audio, reference) pairs the config names, capped at `config.limit`, and how many
    items were left out because their reference normalises to nothing (WER is undefined there).
    """
    items = _manifest_items(config.manifest) if config.manifest is not None else _hub_items(config)
    utterances: list[Utterance] = []
    unscorable = 0
    for utterance in items:
        if config.limit is not None and len(utterances) >= config.limit:
            break
        if kind.normalize(utterance.reference):
            utterances.append(utterance)
        else:
            unscorable += 1
    keys = [u.key for u in utterances]
    if len(set(keys)) != len(keys):
        raise ValueError("wer: utterance ids repeat; give every item a unique id (or drop id_column)")
    if not utterances:
        raise ValueError("wer: the dataset holds no utterance with a non-empty reference")
    return utterances, unscorable


def _manifest_items(manifest: Path) -> Iterator[Utterance]:
    if not manifest.is_file():
        raise FileNotFoundError(f"wer: manifest {manifest} does not exist")
    for number, line in enumerate(manifest.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            audio_path = manifest.parent / row["audio"]
            reference = row["text"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"wer: {manifest} line {number}: expected {{'audio': ..., 'text': ...}}: {exc}") from exc
        if not audio_path.is_file():
            raise FileNotFoundError(f"wer: {manifest} line {number}: audio file {audio_path} does not exist")
        yield Utterance(str(row.get("id", row["audio"])), audio_path.name, audio_path.read_bytes(), reference)


def _hub_items(config: WerConfig) -> Iterator[Utterance]:
    """Undecoded audio bytes: the server decodes them, and no local audio decoder is needed."""
    import datasets

    assert config.hub_path is not None
    dataset = datasets.load_dataset(config.hub_path, config.hub_name, split=config.split, revision=config.revision)
    missing = {config.audio_column, config.text_column} - set(dataset.column_names)
    if missing:
        raise ValueError(
            f"wer: dataset {config.hub_path} has no column(s) {sorted(missing)}; it has {dataset.column_names}; "
            "set audio_column / text_column"
        )
    dataset = dataset.cast_column(config.audio_column, datasets.Audio(decode=False))
    with_ids = config.id_column is not None and config.id_column in dataset.column_names
    for index, row in enumerate(dataset):
        audio = row[config.audio_column]
        name = Path(audio.get("path") or f"{index}.wav").name
        data = audio["bytes"] if audio.get("bytes") is not None else Path(audio["path"]).read_bytes()
        key = str(row[config.id_column]) if with_ids else f"{index:06d}"
        yield Utterance(key, name, data, row[config.text_column])


def score(utterance: Utterance, hypothesis: str, error: str | None = None) -> Sample:
    """One utterance's sample with its word-level edit counts against the normalised reference."""
    import jiwer

    ref_norm, hyp_norm = kind.normalize(utterance.reference), kind.normalize(hypothesis)
    counts = jiwer.process_words(ref_norm, hyp_norm)
    found = kind.WordCounts(
        substitutions=counts.substitutions,
        deletions=counts.deletions,
        insertions=counts.insertions,
        ref_words=len(ref_norm.split()),
    )
    return Sample(
        key=utterance.key,
        prompt_hash=utterance.audio_hash,
        prompt=utterance.filename,
        target=utterance.reference,
        response=hypothesis,
        extracted={"normalized": hyp_norm},
        error=error,
        data={kind.NAME: found.model_dump()},
    )


class _Transcriber:
    """Sends clips to the server with bounded concurrency and retries; stops on the run's flag."""

    def __init__(self, context: SuiteContext, client: httpx.AsyncClient) -> None:
        self.context = context
        self.config: WerConfig = context.config
        self.client = client
        self.url = f"{context.server_url.rstrip('/')}/v1/audio/transcriptions"

    async def transcribe(self, utterance: Utterance) -> tuple[str, str | None]:
        """(hypothesis, error): after the last failed attempt the hypothesis is empty."""
        form = {
            "model": self.context.served_model_name,
            "language": self.config.language,
            "temperature": str(self.config.temperature),
            "response_format": "json",
        }

        def stop() -> None:
            if self.context.should_stop():
                raise SuiteAborted("wer: the run was stopped")

        response, error, tries = await retry.send(
            lambda: self.client.post(self.url, data=form, files={"file": (utterance.filename, utterance.audio)}),
            self.config.max_retries + 1, BACKOFF_S, BACKOFF_CAP_S, before_each=stop,
        )  # fmt: skip
        if response is not None:
            if response.status_code == 200:
                return _transcript(response)
            error = f"HTTP {response.status_code}: {response.text[:300]}"
        return "", f"{utterance.key}: gave up after {tries} attempt(s): {error}"


def _transcript(response: httpx.Response) -> tuple[str, str | None]:
    try:
        text = response.json().get("text")
    except (ValueError, AttributeError):
        text = None
    if not isinstance(text, str):
        return "", f"HTTP 200 without a transcript: {response.text[:300]}"
    return text, None


async def _transcribe_all(context: SuiteContext, todo: list[Utterance], finished: list[Sample], total: int) -> None:
    config: WerConfig = context.config
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
    async with httpx.AsyncClient(timeout=config.request_timeout_s, limits=limits) as client:
        transcriber = _Transcriber(context, client)

        async def one(utterance: Utterance) -> None:
            hypothesis, error = await transcriber.transcribe(utterance)
            sample = score(utterance, hypothesis, error)
            context.emit_samples([sample])
            finished.append(sample)
            context.progress(len(finished), total)

        await pool.each(todo, config.concurrency, one)


def run(context: SuiteContext) -> SuiteOutcome:
    config: WerConfig = context.config
    utterances, unscorable = load_utterances(config)
    finished: list[Sample] = []
    todo: list[Utterance] = []
    for utterance in utterances:
        earlier = context.done_samples.get(utterance.key)
        if earlier is not None and earlier.error is None and earlier.prompt_hash == utterance.audio_hash:
            finished.append(score(utterance, earlier.response))  # rescored: only the request is saved
        else:
            todo.append(utterance)
    reused = len(finished)
    context.progress(reused, len(utterances))
    if todo:
        asyncio.run(_transcribe_all(context, todo, finished, len(utterances)))
    order = {u.key: i for i, u in enumerate(utterances)}
    samples = sorted(finished, key=lambda s: order[s.key])
    empty = sum(1 for s in samples if not s.extracted["normalized"])
    found = [c for c in map(kind.counts, samples) if c is not None]
    totals = {name: sum(getattr(c, name) for c in found) for name in kind.WordCounts.model_fields}
    errors = [c.errors for c in found]
    words = [c.ref_words for c in found]
    low, high = stats.bootstrap_wer_interval(errors, words)
    metric = MetricValue(
        name="wer",
        value=stats.corpus_wer(errors, words),
        n=len(samples),
        stderr=stats.wer_stderr(errors, words),
        ci_low=low,
        ci_high=high,
        direction="lower",
    )
    source = str(config.manifest) if config.manifest else f"{config.hub_path}:{config.hub_name}:{config.split}"
    return SuiteOutcome(
        metrics=[metric],
        samples=samples,
        empty_response_rate=empty / len(samples),
        details={
            "dataset": source,
            "utterances": len(samples),
            "empty_responses": empty,
            "failed_requests": sum(1 for s in samples if s.error),
            "reused_samples": reused,
            "unscorable_references": unscorable,
            **totals,
        },
    )


DEFINITION = SuiteDefinition(name="wer", config_model=WerConfig, metrics=(MetricSpec("wer", kind.KIND),), run=run)
