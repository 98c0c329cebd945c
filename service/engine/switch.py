"""Move a running engine from one arm to the next, and prove that nothing of the first carried over.

An engine started switchable (`Engine(..., switchable=True)`) mixes kvcanary's worker extension
into every worker and serves vLLM's dev routes on its local port. Between two arms:

1. the prefix-cache probe (one whole KV page of fixed tokens, sent twice) is cached while the
   previous arm's kernels serve: the second request must hit, which proves the probe can;
2. `POST /collective_rpc` runs `kvcanary_switch` on every worker: the new variant and canaries,
   the KV cache refilled (zeros, or NaN under nan_kv_tail), receipts into the new arm's folder;
3. `POST /reset_prefix_cache` empties the prefix cache;
4. the probe is sent again: vLLM's prefix-cache hit counter (`vllm:prefix_cache_hits` in
   `/metrics`) must not rise, or the previous arm's KV would be reused; then the cache is
   emptied once more, so that the arm starts as on a fresh engine.

vLLM 0.24 answers `/reset_prefix_cache` with an empty 200 whether or not the reset happened;
0.25 and later answer `{"success": bool}`. The hit counter decides in both.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx

from kernels.receipt import read_receipts, write_receipt
from kernels.worker_extension import DESCRIBE_METHOD, SWITCH_METHOD
from service.profiles import Profile

PROBE_TEXT = "kvcanary probe of the prefix cache between two arms of one engine. "
HITS_METRIC = "vllm:prefix_cache_hits_total"
_TIMEOUT_S = 600.0  # a switch refills the whole KV cache; a probe is one page of prefill
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(?P<value>\S+)")


class SwitchError(RuntimeError):
    """The engine could not be moved to the next arm, or the move could not be proven clean."""


def prefix_cache_hits(metrics_text: str) -> float:
    """The sum of vLLM's prefix-cache hit counter over its label sets, from `/metrics` text."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if match and match["name"] == HITS_METRIC:
            total += float(match["value"])
            seen = True
    if not seen:
        raise SwitchError(f"/metrics has no {HITS_METRIC}: this vLLM does not report prefix-cache hits")
    return total


class PrefixProbe:
    """One KV page plus a token of fixed tokens: enough for vLLM to cache (and hit) a full page."""

    def __init__(self, client: httpx.Client, model: str, block_size: int) -> None:
        self.client, self.model = client, model
        ids: list[int] = []
        while len(ids) <= block_size:
            answer = client.post("/tokenize", json={"model": model, "prompt": PROBE_TEXT * 8})
            more = answer.raise_for_status().json()["tokens"]
            if not more:
                raise SwitchError("/tokenize returned no tokens for the prefix-cache probe")
            ids += more
        self.tokens = ids[: block_size + 1]

    def hits(self) -> float:
        return prefix_cache_hits(self.client.get("/metrics").raise_for_status().text)

    def send(self) -> float:
        """Send the probe (one generated token); returns how much the hit counter rose."""
        before = self.hits()
        body = {"model": self.model, "prompt": self.tokens, "max_tokens": 1, "temperature": 0.0}
        self.client.post("/v1/completions", json=body).raise_for_status()
        return self.hits() - before


def _rpc(client: httpx.Client, method: str, *args: str) -> list[dict[str, Any]]:
    answer = client.post("/collective_rpc", json={"method": method, "args": list(args)})
    if answer.status_code == 404:
        raise SwitchError("the engine serves no /collective_rpc: it was started without VLLM_SERVER_DEV_MODE=1")
    if answer.status_code != 200:
        raise SwitchError(f"/collective_rpc {method} answered HTTP {answer.status_code}: {answer.text[:500]}")
    results = answer.json().get("results")
    if not results or not all(isinstance(r, dict) for r in results):
        raise SwitchError(f"/collective_rpc {method}: every worker must answer an object, got {results!r}")
    return list(results)


def reset_prefix_cache(client: httpx.Client) -> None:
    """Empty the prefix cache; a 0.25+ engine that says it could not (blocks still held) fails."""
    answer = client.post("/reset_prefix_cache")
    if answer.status_code != 200:
        raise SwitchError(f"/reset_prefix_cache answered HTTP {answer.status_code}: {answer.text[:500]}")
    if answer.content and answer.json().get("success") is False:
        raise SwitchError("/reset_prefix_cache: vLLM could not reset the prefix cache (blocks still held)")


def _carry_receipts(old_dir: Path, new_dir: Path, switched: set[int], arm: str, generation: int) -> None:
    """Receipts of processes the switch does not reach (API server, a separate engine core): copied
    into the arm's folder, saying that they were written before the switch."""
    for receipt in read_receipts(old_dir):
        if int(receipt["pid"]) in switched or receipt.get("runs_model"):
            continue
        note = f"written before switch {generation} to arm {arm}: this process runs no model and is not switched"
        write_receipt(new_dir, {**receipt, "switch": {**receipt.get("switch", {}), "carried": note}})


def switch_engine(
    url: str, profile: Profile, receipt_dir: Path, arm: str, generation: int, old_receipt_dir: Path
) -> dict[str, Any]:
    """Steps 1-4 of the module's sequence against the engine at `url`; what each step found."""
    request = {
        "variant": profile.kernels.variant,
        "canaries": list(profile.kernels.canaries),
        "receipt_dir": str(receipt_dir),
        "arm": arm,
        "generation": generation,
    }
    with httpx.Client(base_url=url, timeout=_TIMEOUT_S) as client:
        try:
            workers = _rpc(client, DESCRIBE_METHOD)
            sizes = {w.get("block_size") for w in workers}
            [block_size] = sizes if len(sizes) == 1 else [None]
            if not isinstance(block_size, int):
                raise SwitchError(f"workers report KV page sizes {sorted(map(str, sizes))}; expected one")
            probe = PrefixProbe(client, profile.served_model_name, block_size)
            probe.send()
            primed = probe.send()  # the same page again: a hit, where prefix caching is on
            done = _rpc(client, SWITCH_METHOD, json.dumps(request))
            reset_prefix_cache(client)
            after = probe.send()
            reset_prefix_cache(client)
        except httpx.HTTPError as exc:
            raise SwitchError(f"the engine at {url} did not answer during the switch to arm {arm}: {exc!r}") from exc
    wrong = [w for w in done if w.get("generation") != generation or w.get("variant") != request["variant"]]
    if wrong or len(done) != len(workers):
        raise SwitchError(f"switch {generation} to arm {arm}: {len(done)} of {len(workers)} workers answered, {wrong}")
    if after > 0:
        raise SwitchError(
            f"the prefix cache kept KV of the arm before {arm}: the probe hit {after:g} tokens after the reset"
        )
    _carry_receipts(old_receipt_dir, receipt_dir, {int(w["pid"]) for w in done}, arm, generation)
    return {
        "generation": generation,
        "workers": done,
        "prefix_cache": {
            "probe_tokens": len(probe.tokens),
            "hits_before_reset": primed,
            "hits_after_reset": after,
            "caching": primed > 0,
        },
    }
