"""The requests that build each invariance condition for one arm (`evals.suites.invariance`).

`Asker` sends completions in the prompt's frame and times them per condition; `sequential`
builds the conditions that need nothing else running (decode vs prefill, a prefix-cache hit, a
long preamble, the arm's teacher-forced pass over the control's sequence); `batch` and `family`
send every prompt at once. A condition that cannot be built gets `skipped(reason)`.
`InvarianceConfig`, the suite's profile block, lives here because it names these conditions
and every builder reads it.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from evals.drift_verdict import DEFAULT_DLOGPROB_MARGIN, DEFAULT_KL_MARGIN, DEFAULT_TAIL_MARGIN
from evals.invariance import Observation, observe, row, skipped
from evals.suites.base import SuiteConfig
from evals.suites.drift import Prompt
from evals.suites.logprob_client import Client, NotFinite, number, token_id

ConditionName = Literal["decode_prefill", "batch", "prefix_hit", "prefix_family", "long_context"]
PER_REQUEST: tuple[ConditionName, ...] = ("decode_prefill", "batch", "prefix_hit", "prefix_family", "long_context")


class InvarianceConfig(SuiteConfig):
    """`limit` GSM8k prompts; `conditions` the per-request conditions to build; `tolerances` and
    `dlogprob_tolerances` a per-condition KL and decode |delta logprob| margin (nats over the floor)
    where one must differ from `kl_tolerance` / `dlogprob_tolerance`: an engine-level arm that
    changes more than attention (CUDA graphs compile the model) moves decode logprobs honestly."""

    limit: int | None = Field(16, ge=1)
    source: Literal["gsm8k", "recall"] = "gsm8k"  # as the drift suite's (DriftConfig)
    ladder: list[int] = Field(default_factory=list)
    questions_file: Path = Path("fixture:gsm8k-test.jsonl")
    fewshot_file: Path = Path("fixture:gsm8k-fewshot.jsonl")
    num_fewshot: int = Field(5, ge=0)
    max_tokens: int = Field(16, ge=1)
    logprobs: int = Field(5, ge=1, le=20)
    concurrency: int = Field(64, ge=1)
    block_size: int | None = Field(None, ge=2)
    conditions: list[ConditionName] = Field(default_factory=lambda: list(PER_REQUEST))
    batch_fillers: int = Field(8, ge=0)
    preamble_text: str = Field("\n", min_length=1)
    min_preamble_tokens: int = Field(128, ge=1)
    seed: int = 0
    kl_tolerance: float = Field(DEFAULT_KL_MARGIN, ge=0)
    tolerances: dict[str, float] = Field(default_factory=dict)
    dlogprob_tolerance: float = Field(DEFAULT_DLOGPROB_MARGIN, ge=0)
    dlogprob_tolerances: dict[str, float] = Field(default_factory=dict)
    tail_tolerance: float = Field(DEFAULT_TAIL_MARGIN, ge=0)

    @field_validator("tolerances", "dlogprob_tolerances")
    @classmethod
    def _known_conditions(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - {*PER_REQUEST, "arm"})
        if unknown:
            raise ValueError(f"no condition named {', '.join(unknown)}; conditions: {', '.join([*PER_REQUEST, 'arm'])}")
        if any(v < 0 for v in value.values()):
            raise ValueError("a tolerance is nats over the floor: it cannot be negative")
        return value


_LABEL = re.compile(r'(\w+)="([^"]*)"')
_HITS = re.compile(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.eE+-]+)$", re.M)


@dataclass
class EngineFacts:
    """What the suite learns about the engine: block size, context length, prefix caching."""

    block_size: int
    max_len: int
    prefix_caching: bool | None  # None: the engine does not say (no vllm:cache_config_info)
    info: dict[str, str] = field(default_factory=dict)


class Asker:
    """Completions in the prompt's frame, each request timed against the condition it serves."""

    def __init__(self, client: Client, config: InvarianceConfig) -> None:
        self.client, self.config = client, config
        self.seconds: dict[str, float] = {}

    async def ask(
        self, ids: Sequence[int], tokens: int, *, teacher: bool = True, salt: str | None = None, frame: int = 0
    ) -> tuple[Observation, int | None]:
        """Greedy `tokens` after `ids` with the decode top-k, and with `teacher` the prompt's top-k
        (teacher-forced); positions counted from `frame`. Returns the cached tokens when reported."""
        k = self.config.logprobs
        body: dict[str, Any] = {"model": self.client.context.served_model_name, "prompt": list(ids),
                                "max_tokens": tokens, "temperature": 0.0, "logprobs": k,
                                "return_tokens_as_token_ids": True}  # fmt: skip
        if teacher:
            body["prompt_logprobs"] = k
        if salt is not None:
            body["cache_salt"] = salt
        try:
            found = await self.client.post("/v1/completions", body)
        except NotFinite:  # the tokens without their (non-finite) logprobs
            plain = {key: v for key, v in body.items() if key not in ("logprobs", "prompt_logprobs")}
            answer = await self.client.post("/v1/completions", {**plain, "return_tokens_as_token_ids": False,
                                                                "return_token_ids": True})  # fmt: skip
            seen = [*ids[frame:], *answer["choices"][0]["token_ids"]]
            return Observation(seen, {}, answered=False), _cached(answer)
        choice = found["choices"][0]
        decoded = choice.get("logprobs") or {}
        tops: dict[int, dict[int, float]] = {}
        for i, step in enumerate(choice.get("prompt_logprobs") or []):
            if i - frame >= 1 and step:
                tops[i - frame] = {
                    int(t): number(e.get("logprob")) for t, e in step.items() if (e.get("rank") or 0) <= k
                }
        for j, step in enumerate(decoded.get("top_logprobs") or []):
            tops[len(ids) - frame + j] = {token_id(t): number(lp) for t, lp in (step or {}).items()}
        generated = [token_id(t) for t in decoded.get("tokens") or []]
        return Observation([*ids[frame:], *generated], tops), _cached(found)

    async def timed(self, condition: str, work: Awaitable[Any]) -> Any:
        began = time.monotonic()
        try:
            return await work
        finally:
            self.seconds[condition] = self.seconds.get(condition, 0.0) + time.monotonic() - began

    async def hits(self) -> float | None:
        """The engine's prefix-cache hit counter (tokens), None when /metrics has none."""
        found = _HITS.findall((await self.client.client.get(f"{self.client.base}/metrics")).text)
        return sum(float(x) for x in found) if found else None


def _cached(answer: dict[str, Any]) -> int | None:
    """The prompt tokens a response says came from the prefix cache (None: it does not say)."""
    found = ((answer.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    return int(found) if found is not None else None


async def engine_facts(client: Client, prompts: Sequence[Prompt], config: InvarianceConfig) -> EngineFacts:
    metrics = (await client.client.get(f"{client.base}/metrics")).text
    line = next((ln for ln in metrics.splitlines() if ln.startswith("vllm:cache_config_info{")), "")
    info = dict(_LABEL.findall(line))
    caching = {"True": True, "False": False}.get(info.get("enable_prefix_caching", ""))
    _, max_len = await client.tokenize(prompts[0].text) if prompts else ([], 0)
    return EngineFacts(await client.block_size(), max_len or 10**9, caching, info)


def skip_prefix(engine: EngineFacts) -> str | None:
    if engine.prefix_caching is False:
        return "the engine serves without prefix caching (/metrics vllm:cache_config_info enable_prefix_caching=False)"
    return None


def fresh_salt() -> str:
    return uuid.uuid4().hex


@dataclass
class PromptRun:
    """One prompt's observations and condition rows as the phases fill them in."""

    prompt: Prompt
    alone: Observation
    again: Observation
    teacher: Observation
    cold: Observation | None = None
    arm: Observation | None = None  # this arm's teacher-forced pass over the control's sequence
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.prompt.ids)


def hit_row(
    drift: tuple[Any, int], floor: tuple[Any, int], cached: int | None, want: int, source: str
) -> dict[str, Any]:
    """A cache condition's row, or its skip when the engine reported no hit at all."""
    if cached is not None and cached <= 0:
        return skipped(f"no prefix-cache hit happened: the engine reported 0 cached tokens where {want} were expected")
    return row(
        drift, floor, cached_tokens=cached, expected_cached=want, verified_by=source if cached is not None else None
    )


async def sequential(asker: Asker, item: PromptRun, engine: EngineFacts, config: InvarianceConfig,
                      control: Observation | None) -> None:  # fmt: skip
    """The conditions built one request at a time, with nothing else running."""
    p, n, tokens = item.prompt, item.n, config.max_tokens
    want = set(config.conditions)
    if "decode_prefill" in want:
        item.conditions["decode_prefill"] = row(
            observe(item.alone, item.teacher, n), observe(item.alone, item.again, n)
        )
    cache_skip = skip_prefix(engine)
    if want & {"prefix_hit", "prefix_family"} and cache_skip is None:
        item.cold, _ = await asker.timed("prefix_hit", asker.ask(p.ids, tokens, teacher=False, salt=fresh_salt()))
    if "prefix_hit" in want:
        blocks = (n - 1) // engine.block_size
        if cache_skip is not None or item.cold is None:
            item.conditions["prefix_hit"] = skipped(cache_skip or "not built")
        elif blocks == 0:
            item.conditions["prefix_hit"] = skipped(
                f"the prompt's {n} tokens fill no whole {engine.block_size}-token block before its last token; "
                "vLLM caches whole blocks only"
            )
        else:

            async def hit() -> dict[str, Any]:
                floor, _ = await asker.ask(p.ids, tokens, teacher=False, salt=fresh_salt())
                salt = fresh_salt()
                await asker.ask(p.ids[: blocks * engine.block_size], 1, teacher=False, salt=salt)
                before = await asker.hits()
                found, cached = await asker.ask(p.ids, tokens, teacher=False, salt=salt)
                source = "usage.prompt_tokens_details"
                if cached is None and before is not None:
                    after = await asker.hits()
                    cached, source = int((after or before) - before), "/metrics vllm:prefix_cache_hits"
                assert item.cold is not None
                return hit_row(observe(item.cold, found, n), observe(item.cold, floor, n), cached,
                                blocks * engine.block_size, source)  # fmt: skip

            item.conditions["prefix_hit"] = await asker.timed("prefix_hit", hit())
    if "long_context" in want:
        room = engine.max_len - n - tokens - 1
        if room < config.min_preamble_tokens:
            item.conditions["long_context"] = skipped(
                f"too long for a preamble: its {n} tokens and {tokens} of continuation leave {max(room, 0)} of "
                f"max_model_len {engine.max_len} positions, fewer than min_preamble_tokens {config.min_preamble_tokens}"
            )
        else:

            async def long() -> dict[str, Any]:
                body = {"model": asker.client.context.served_model_name, "prompt": config.preamble_text,
                        "add_special_tokens": False}  # fmt: skip
                unit = [int(t) for t in (await asker.client.post("/tokenize", body))["tokens"]]
                preamble = (unit * (room // max(1, len(unit)) + 1))[:room]
                first, _ = await asker.ask([*preamble, *p.ids], tokens, frame=room)
                second, _ = await asker.ask([*preamble, *p.ids], tokens, frame=room)
                forced, _ = await asker.ask([*preamble, *first.tokens], 1, frame=room)
                return row(observe(first, forced), observe(first, second), preamble_tokens=room,
                           context_tokens=room + len(first.tokens))  # fmt: skip

            item.conditions["long_context"] = await asker.timed("long_context", long())
    if control is not None:
        item.arm, _ = await asker.timed("arm", asker.ask(control.tokens, 1))


async def batch(asker: Asker, items: Sequence[PromptRun], config: InvarianceConfig) -> None:
    """Every prompt inside a ragged batch (the prompts plus fillers of random lengths, all sent at
    once), twice in other compositions: alone vs the first, floor the first vs the second."""
    pool = [t for item in items for t in item.prompt.ids]
    rounds: list[dict[str, Observation]] = []
    for round_ in range(2):
        rng = random.Random(config.seed * 2 + round_)
        fillers = [pool[: rng.randint(8, max(8, len(items[0].prompt.ids)))] for _ in range(config.batch_fillers)]
        jobs: list[tuple[str | None, Sequence[int], int]] = [
            (i.prompt.key, i.prompt.ids, config.max_tokens) for i in items
        ]
        jobs += [(None, ids, rng.randint(1, 2 * config.max_tokens)) for ids in fillers]
        rng.shuffle(jobs)
        answers = await asyncio.gather(*(asker.ask(ids, tokens) for _, ids, tokens in jobs))
        rounds.append({key: obs for (key, _, _), (obs, _) in zip(jobs, answers, strict=True) if key is not None})
    for item in items:
        key = item.prompt.key
        item.conditions["batch"] = row(observe(item.alone, rounds[0][key]), observe(rounds[0][key], rounds[1][key]))


def shared_prefix(items: Sequence[PromptRun]) -> int:
    first = items[0].prompt.ids
    shared = min(len(i.prompt.ids) - 1 for i in items)
    for item in items[1:]:
        shared = next((j for j in range(shared) if item.prompt.ids[j] != first[j]), shared)
    return shared


async def family(asker: Asker, items: Sequence[PromptRun], engine: EngineFacts, config: InvarianceConfig) -> None:
    """Every prompt sent together after their shared prefix's whole blocks were served (one salt
    per round), twice in other orders: cold vs the first, floor the first vs the second."""
    reason = skip_prefix(engine)
    shared = shared_prefix(items) if len(items) > 1 else 0
    blocks = shared // engine.block_size
    if reason is None and len(items) < 2:
        reason = "one prompt is no family"
    elif reason is None and blocks == 0:
        reason = (f"the prompts share {shared} tokens, less than one {engine.block_size}-token block; vLLM caches "
                  "whole blocks only")  # fmt: skip
    if reason is not None or any(i.cold is None for i in items):
        for item in items:
            item.conditions["prefix_family"] = skipped(reason or "not built")
        return
    rounds: list[dict[str, tuple[Observation, int | None]]] = []
    source = "usage.prompt_tokens_details"
    for order in (items, list(reversed(items))):
        salt = fresh_salt()
        await asker.ask(order[0].prompt.ids[: blocks * engine.block_size], 1, teacher=False, salt=salt)
        before = await asker.hits()
        answers = await asyncio.gather(
            *(asker.ask(i.prompt.ids, config.max_tokens, teacher=False, salt=salt) for i in order)
        )
        found = {i.prompt.key: answer for i, answer in zip(order, answers, strict=True)}
        if all(cached is None for _, cached in answers) and before is not None:  # a total over the family
            each = int(((await asker.hits()) or before) - before) // len(order)
            found = {key: (obs, each) for key, (obs, _) in found.items()}
            source = "/metrics vllm:prefix_cache_hits (the family's total, per prompt)"
        rounds.append(found)
    for item in items:
        key = item.prompt.key
        assert item.cold is not None
        (first, cached), (second, _) = rounds[0][key], rounds[1][key]
        item.conditions["prefix_family"] = hit_row(
            observe(item.cold, first, item.n),
            observe(first, second, item.n),
            cached,
            blocks * engine.block_size,
            source,
        )
