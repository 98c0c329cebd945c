"""The recall sweep: does every key on every kernel cut still reach the answer?

It serves the retrieval fixture (`evals.fixtures.retrieval_model`) associative-recall prompts
whose answer must be copied from one KV position, placed on every cut kernels make (tiles,
pages, split-KV pieces, prefill chunks; `evals.recall_positions`) at every length of a ladder up
to the model's context, sent `concurrency` at a time in a shuffled order so that batches mix
lengths. An item is right when the greedy answer is the needle's symbols, word for word; the
metric `recall` is accuracy (`evals.kinds.accuracy`), so an A/B run pairs each arm with the
control arm item by item (exact McNemar) and a mutant that loses or misreads one key fails
where it fires. Each sample keeps its length, position, cuts and the first answer word that went
wrong (`data["recall"]`): `evals.recall_positions.table` prints "key 4,095 of 8,192 misread in
3 of 3 prompts" per position and arm.

Words are tokens of the fixture's own tokenizer; the suite checks that the server counted each
prompt's tokens as words (a different model would silently move every key).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from typing import Any

import httpx
from pydantic import Field

from evals import pool, retry
from evals.fixtures import retrieval_data
from evals.fixtures.retrieval_data import last_position
from evals.kinds.accuracy import KIND as ACCURACY
from evals.recall_positions import Cuts, Item, misreads, plan
from evals.suites.base import (
    MetricSpec,
    MetricValue,
    Sample,
    SuiteAborted,
    SuiteConfig,
    SuiteContext,
    SuiteDefinition,
    SuiteOutcome,
)

NAME = "recall"
METRIC = "recall"
BACKOFF_S = 0.5
BACKOFF_CAP_S = 8.0


class RecallConfig(SuiteConfig):
    """The ladder of prompt lengths (words = tokens; lengths past the server's context are left
    out), the cut sizes, how many cuts of each kind per length, and prompts per position."""

    lengths: list[int] = Field(default_factory=lambda: [13, 16, 17, 64, 65, 481, 1024, 2048, 4096, 8192, 16384])
    tiles: list[int] = Field(default_factory=lambda: [16, 32, 64])
    pages: list[int] = Field(default_factory=lambda: [16, 480])
    splits: list[int] = Field(default_factory=lambda: [2, 3, 4, 8])
    chunks: list[int] = Field(default_factory=lambda: [2048])
    per_kind: int = Field(3, ge=1)
    repeats: int = Field(3, ge=1)
    seed: int = 0
    concurrency: int = Field(16, ge=1)

    def cuts(self) -> Cuts:
        return Cuts(tuple(self.tiles), tuple(self.pages), tuple(self.splits), tuple(self.chunks))


def items(config: RecallConfig, max_len: int) -> list[Item]:
    """The sweep's items whose prompt and answer fit `max_len` positions, at most `limit`."""
    lengths = [n for n in config.lengths if n + retrieval_data.ANSWER_WORDS <= max_len]
    found = plan(lengths, config.cuts(), config.per_kind, config.repeats)
    return found[: config.limit] if config.limit is not None else found


def recall_prompt(item: Item, seed: int) -> retrieval_data.Recall:
    """The item's prompt; the haystack depends on the sweep's seed and the item's key only."""
    digest = hashlib.sha256(f"{seed}:{item.key}".encode()).digest()
    return retrieval_data.prompt(item.length, item.position, seed=int.from_bytes(digest[:8], "big"))


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def score(item: Item, recall: retrieval_data.Recall, generated: list[int]) -> Sample:
    """The item's sample: right when the answer words are the needle's symbols; `first_wrong`
    is the answer word (reading KV position `position + first_wrong`) that went wrong first."""
    values = retrieval_data.token_ids(recall.answer[: retrieval_data.ANSWER_WORDS])
    first_wrong = next((i for i, v in enumerate(values) if i >= len(generated) or generated[i] != v), None)
    words = [retrieval_data.VOCAB[t] if 0 <= t < len(retrieval_data.VOCAB) else f"<{t}>" for t in generated]
    target = " ".join(recall.answer[: retrieval_data.ANSWER_WORDS])
    return Sample(
        key=item.key,
        prompt_hash=_hash(recall.text),
        prompt=recall.text if item.length <= 256 else f"<{item.length} words: needle at {item.position}>",
        target=target,
        response=" ".join(words),
        extracted={METRIC: " ".join(words)},
        correct={METRIC: first_wrong is None},
        data={"recall": {"length": item.length, "position": item.position, "repeat": item.repeat,
                         "cuts": list(item.cuts), "first_wrong": first_wrong, "tokens": generated}},
    )  # fmt: skip


class _Server:
    """Greedy completions and the context length, with the project's one retry rule."""

    def __init__(self, context: SuiteContext, http: httpx.AsyncClient) -> None:
        self.context, self.http = context, http
        self.base = context.server_url.rstrip("/")

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        def stop() -> None:
            if self.context.should_stop():
                raise SuiteAborted("recall: the run was stopped")

        config: RecallConfig = self.context.config
        response, error, tries = await retry.send(
            lambda: self.http.post(f"{self.base}{path}", json=body), config.max_retries + 1, BACKOFF_S, BACKOFF_CAP_S,
            before_each=stop,
        )  # fmt: skip
        if response is not None and response.status_code == 200:
            found: dict[str, Any] = response.json()
            return found
        if response is not None:
            error = f"HTTP {response.status_code}: {response.text[:300]}"
        raise RuntimeError(f"recall: {path} failed after {tries} attempt(s): {error}")

    async def max_len(self) -> int:
        found = await self.post("/tokenize", {"model": self.context.served_model_name, "prompt": "?"})
        return int(found.get("max_model_len") or 0)

    async def answer(self, recall: retrieval_data.Recall) -> list[int]:
        body = {
            "model": self.context.served_model_name,
            "prompt": recall.text,
            "max_tokens": retrieval_data.ANSWER_WORDS,
            "temperature": 0.0,
            "return_token_ids": True,
        }
        found = await self.post("/v1/completions", body)
        counted = int((found.get("usage") or {}).get("prompt_tokens", len(recall.words)))
        if counted != len(recall.words):
            raise ValueError(
                f"recall: the server counted {counted} tokens in a {len(recall.words)}-word prompt; the sweep needs "
                "the retrieval fixture's word-level tokenizer (fixture:retrieval-tiny or fixture:retrieval-tiny-mla)"
            )
        return [int(t) for t in found["choices"][0].get("token_ids") or []]


async def _run(context: SuiteContext) -> tuple[list[Sample], int]:
    config: RecallConfig = context.config
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
    async with httpx.AsyncClient(timeout=config.request_timeout_s, limits=limits) as http:
        server = _Server(context, http)
        todo = items(config, await server.max_len() or 10**9)
        if not todo:
            raise ValueError(f"recall: no length of {config.lengths} fits the server's context")
        prompts = {item.key: recall_prompt(item, config.seed) for item in todo}
        done: dict[str, Sample] = {}
        for item in todo:
            earlier = context.done_samples.get(item.key)
            if earlier is not None and earlier.prompt_hash == _hash(prompts[item.key].text):
                done[item.key] = earlier
        reused = len(done)
        context.progress(reused, len(todo))
        order = [item for item in todo if item.key not in done]
        random.Random(config.seed).shuffle(order)  # batches mix lengths and positions

        async def answer(item: Item) -> None:
            recall = prompts[item.key]
            sample = score(item, recall, await server.answer(recall))
            context.emit_samples([sample])
            done[item.key] = sample
            context.progress(len(done), len(todo))

        await pool.each(order, config.concurrency, answer)
    return [done[item.key] for item in todo], reused


def run(context: SuiteContext) -> SuiteOutcome:
    samples, reused = asyncio.run(_run(context))
    right = sum(s.correct[METRIC] for s in samples)
    found = misreads([s.data["recall"] for s in samples])
    bad = [m.sentence() for m in found.values() if m.wrong]
    lengths = sorted({m.length for m in found.values()})
    return SuiteOutcome(
        metrics=[MetricValue(name=METRIC, value=right / len(samples), n=len(samples))],
        samples=samples,
        empty_response_rate=sum(1 for s in samples if not s.data["recall"]["tokens"]) / len(samples),
        details={
            "prompts": len(samples),
            "positions": len(found),
            "lengths": lengths,
            "longest_key": max(last_position(n) for n in lengths),
            "misread_positions": len(bad),
            "misread": bad[:20],
            "reused_samples": reused,
        },
    )


DEFINITION = SuiteDefinition(name=NAME, config_model=RecallConfig, metrics=(MetricSpec(METRIC, ACCURACY),), run=run)
