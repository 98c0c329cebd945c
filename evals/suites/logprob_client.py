"""The server's completions, tokenizer and metrics as the drift and invariance suites ask them.

Greedy decodes with their top-k logprobs (`return_tokens_as_token_ids`), with the project's one
retry rule (`evals.retry`) and the run's stop flag; a server that cannot serialise its logprobs
(vLLM answers 400 for a NaN or an infinity) raises `NotFinite`, and `generate` then keeps the
tokens without them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

import httpx

from evals import retry
from evals.logprob_drift import TopK
from evals.suites.base import SuiteAborted, SuiteContext

BACKOFF_S = 0.5
BACKOFF_CAP_S = 8.0
_BLOCK_SIZE = re.compile(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"')


class Settings(Protocol):
    """What the client reads from its suite's config (the drift and the invariance suites' both have it)."""

    max_retries: int
    max_tokens: int
    logprobs: int
    block_size: int | None


class NotFinite(Exception):
    """The server could not even serialise its logprobs: vLLM answers 400 for a NaN or an infinity."""


class Client:
    """The server's completions, tokenizer and metrics, with retries; stops on the run's flag."""

    def __init__(self, context: SuiteContext, client: httpx.AsyncClient) -> None:
        self.context = context
        self.config: Settings = context.config
        self.client = client
        self.base = context.server_url.rstrip("/")

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with the project's one retry rule (`evals.retry`); 200 or an error naming the cause."""

        def stop() -> None:
            if self.context.should_stop():
                raise SuiteAborted("drift: the run was stopped")

        response, error, tries = await retry.send(
            lambda: self.client.post(f"{self.base}{path}", json=body),
            self.config.max_retries + 1, BACKOFF_S, BACKOFF_CAP_S, before_each=stop,
        )  # fmt: skip
        if response is not None:
            if response.status_code == 200:
                found: dict[str, Any] = response.json()
                return found
            error = f"HTTP {response.status_code}: {response.text[:300]}"
            if response.status_code == 400 and "Out of range float values" in response.text:
                raise NotFinite(error)
        raise RuntimeError(f"drift: {path} failed after {tries} attempt(s): {error}")

    async def tokenize(self, text: str) -> tuple[list[int], int]:
        found = await self.post("/tokenize", {"model": self.context.served_model_name, "prompt": text})
        return [int(t) for t in found["tokens"]], int(found.get("max_model_len") or 0)

    async def block_size(self) -> int:
        if self.config.block_size is not None:
            return self.config.block_size
        response = await self.client.get(f"{self.base}/metrics")
        match = _BLOCK_SIZE.search(response.text)
        if match is None:
            raise RuntimeError("drift: the engine's /metrics has no vllm:cache_config_info block_size; set block_size")
        return int(match.group(1))

    async def generate(self, ids: Sequence[int]) -> tuple[list[int], list[float], list[TopK]]:
        body = {
            "model": self.context.served_model_name,
            "prompt": list(ids),
            "max_tokens": self.config.max_tokens,
            "temperature": 0.0,
            "logprobs": self.config.logprobs,
            "return_tokens_as_token_ids": True,
        }
        try:
            choice = (await self.post("/v1/completions", body))["choices"][0]
        except NotFinite:  # the tokens without their (non-finite) logprobs
            plain = {k: v for k, v in body.items() if k not in ("logprobs", "return_tokens_as_token_ids")}
            tokens = (await self.post("/v1/completions", {**plain, "return_token_ids": True}))["choices"][0][
                "token_ids"
            ]
            return [int(t) for t in tokens], [math.nan] * len(tokens), [{} for _ in tokens]
        found = choice.get("logprobs") or {}
        tokens = [token_id(t) for t in found.get("tokens") or []]
        logprobs = [number(lp) for lp in found.get("token_logprobs") or []]
        top: list[TopK] = [
            {token_id(t): number(lp) for t, lp in (step or {}).items()} for step in found.get("top_logprobs") or []
        ]
        return tokens, logprobs, top

    async def score(self, ids: Sequence[int]) -> tuple[list[TopK], list[float]]:
        """Teacher-forced: the top-k before each next token of `ids`, and that token's logprob."""
        body = {
            "model": self.context.served_model_name,
            "prompt": list(ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": self.config.logprobs,
        }
        try:
            positions = (await self.post("/v1/completions", body))["choices"][0].get("prompt_logprobs") or []
        except NotFinite:
            return [], [math.nan]
        top: list[TopK] = []
        own: list[float] = []
        for index, step in enumerate(positions[1:], start=1):
            entries = {int(t): e for t, e in (step or {}).items()}
            top.append(
                {
                    t: number(e.get("logprob"))
                    for t, e in entries.items()
                    if (e.get("rank") or 0) <= self.config.logprobs
                }
            )
            mine = entries.get(ids[index])
            own.append(number(mine.get("logprob")) if mine else math.nan)
        return top, own


def token_id(token: str) -> int:
    return int(token.removeprefix("token_id:"))


def number(value: Any) -> float:
    """A logprob as the server sent it; null (how a NaN is serialised) stays NaN."""
    return float(value) if isinstance(value, int | float) else math.nan
