"""The invariance suite: does the engine's math change with a serving condition?

Per prompt (GSM8k few-shot prompts from local files) it asks the same tokens under condition
pairs inside one engine and compares the top-k logprobs (`evals.invariance`), each condition
beside the A/A floor measured under that condition (its baseline side run twice):

- `decode_prefill`: the greedy continuation's decode-path logprobs vs the same tokens
  teacher-forced through prefill;
- `batch`: alone (nothing else running) vs inside a full ragged batch of the other prompts and
  fillers sent at the same moment; floor: two batches of other compositions;
- `prefix_hit`: cold (a fresh `cache_salt`) vs a prefix-cache hit after a primer holding the
  prompt's whole blocks was served. vLLM skips the prefix cache for requests that ask for
  prompt_logprobs, so cache conditions compare the greedy continuation's per-step top-k;
- `prefix_family`: cold vs every prompt sent together after their shared few-shot prefix (its
  whole blocks) was cached; floor: the family twice in other orders;
- `long_context`: after a neutral preamble that fills the model to `max_model_len`, the prompt's
  and continuation's positions decoded vs teacher-forced (the short prompt is not compared with
  the long one: a preamble changes a model's predictions, measured at 0.3 nats of KL on the CPU
  fixture);
- `arm` (engine-level, when `reference_samples` hold the control arm's or reference run's
  samples): this arm teacher-forces the control's sequence, compared with the control's own pass,
  against the control's A/A floor. The engine change itself is the arm's (chunked prefill budget,
  graphs vs eager, block size, KV cache dtype).

A condition that cannot be built is skipped with its reason: prefix caching off (read from
`/metrics` `vllm:cache_config_info`), a prompt shorter than a block plus one token, no hit reported
(cached tokens from `usage.prompt_tokens_details`, else the `vllm:prefix_cache_hits` counter),
a prompt too long for a preamble. Samples are stored once every phase is done (the batch and
family phases need every prompt); an interrupted attempt's samples are reused only whole.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import httpx

from evals import invariance as inv
from evals.invariance import Observation, observe
from evals.invariance_conditions import (
    Asker,
    EngineFacts,
    InvarianceConfig,
    PromptRun,
    batch,
    engine_facts,
    family,
    sequential,
)
from evals.kinds.drift import NOT_FINITE
from evals.kinds.invariance import KIND as INVARIANCE
from evals.records import MetricValue, Sample
from evals.suites.base import MetricSpec, SuiteContext, SuiteDefinition, SuiteOutcome
from evals.suites.drift import DriftConfig, Prompt, source_prompts
from evals.suites.logprob_client import Client

NAME = "invariance"
METRIC = "kl"


def _prompt_hash(ids: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


def _reusable(earlier: Sample | None, prompt: Prompt, control: Observation | None) -> bool:
    """An earlier attempt's sample of the same prompt, compared with the same control (or none)."""
    if earlier is None or earlier.prompt_hash != _prompt_hash(prompt.ids) or "conditions" not in earlier.data:
        return False
    return earlier.data.get("control") == (list(control.tokens) if control is not None else None)


def _sample(item: PromptRun, config: InvarianceConfig, engine: EngineFacts, control: Observation | None,
            stored: Mapping[str, Any], seconds: Mapping[str, float],
            change: Mapping[str, Any] | None) -> Sample:  # fmt: skip
    """One prompt's sample; a later arm's condition rows carry the control arm's (`stored`: its sample)."""
    p, n = item.prompt, item.n
    control_floor = stored.get("alone_floor")
    inv.attach_control(item.conditions, stored.get("conditions") or {})
    if control is not None and control_floor is not None and item.arm is not None:
        drift, positions = observe(control, item.arm)
        item.conditions["arm"] = {"drift": drift.as_dict(), "positions": positions, "floor": control_floor["drift"],
                                  "floor_positions": control_floor["positions"]}  # fmt: skip
    built = {name: r for name, r in item.conditions.items() if "skipped" not in r}
    finite = item.alone.finite() and all(r["drift"]["finite"] and r["floor"]["finite"] for r in built.values())
    moved = [name for name, r in built.items()
             if r["drift"]["first_divergence"] is not None and r["floor"]["first_divergence"] is None]  # fmt: skip
    floor, positions = observe(item.alone, item.again)
    data: dict[str, Any] = {
        "prompt_ids": list(p.ids),
        "prompt_len": n,
        "tokens": list(item.alone.tokens[n:]),
        "teacher": inv.pack(item.teacher),
        "alone_floor": {"drift": floor.as_dict(), "positions": positions},
        "conditions": item.conditions,
        "finite": finite,
        "kl_tolerance": config.kl_tolerance,
        "tolerances": dict(config.tolerances),
        "dlogprob_tolerance": config.dlogprob_tolerance,
        "dlogprob_tolerances": dict(config.dlogprob_tolerances),
        "tail_tolerance": config.tail_tolerance,
        "engine_change": dict(change) if change is not None and control is not None else None,
        "engine": {key: engine.info[key] for key in ("block_size", "cache_dtype", "enable_prefix_caching")
                   if key in engine.info},
        "control": list(control.tokens) if control is not None else None,
        "seconds": dict(seconds),
    }  # fmt: skip
    response = f"{len(data['tokens'])} tokens; " + (
        f"diverges under {', '.join(moved)}" if moved else "no argmax moved"
    )
    return Sample(key=p.key, prompt_hash=_prompt_hash(p.ids), prompt=p.text, target="", response=response,
                  data=data, error=None if finite else "non-finite logprobs")  # fmt: skip


async def _run(context: SuiteContext) -> tuple[list[Sample], int]:
    """Every prompt's sample in prompt order, and how many an earlier attempt had stored."""
    config: InvarianceConfig = context.config
    width = max(config.concurrency, (config.limit or 0) + config.batch_fillers + 1)
    limits = httpx.Limits(max_connections=width, max_keepalive_connections=width)
    async with httpx.AsyncClient(timeout=config.request_timeout_s, limits=limits) as http:
        client = Client(context, http)
        source = DriftConfig(limit=config.limit, source=config.source, ladder=config.ladder,
                             questions_file=config.questions_file, fewshot_file=config.fewshot_file,
                             num_fewshot=config.num_fewshot, max_tokens=config.max_tokens)  # fmt: skip
        prompts = [replace(p, shared=0) for p in (await source_prompts(client, source))[0]]
        stored = {key: s.data for key, s in context.reference_samples.items() if "teacher" in s.data}
        missing = [p.key for p in prompts if p.key not in stored]
        if stored and missing:
            raise ValueError(
                f"invariance: the control stored no output for {len(missing)} prompts ({', '.join(missing[:5])}); "
                "run both arms with the same invariance config"
            )
        controls = {key: inv.unpack(data["teacher"]) for key, data in stored.items()}
        if prompts and all(_reusable(context.done_samples.get(p.key), p, controls.get(p.key)) for p in prompts):
            return [context.done_samples[p.key] for p in prompts], len(prompts)
        engine = await engine_facts(client, prompts, config)
        asker = Asker(client, config)
        phases = 1 + ("batch" in config.conditions) + ("prefix_family" in config.conditions)
        done, total = 0, phases * len(prompts)
        context.progress(done, total)
        items = []
        for p in prompts:
            alone, _ = await asker.timed("alone", asker.ask(p.ids, config.max_tokens))
            again, _ = await asker.timed("alone", asker.ask(p.ids, config.max_tokens))
            forced, _ = await asker.timed("alone", asker.ask(alone.tokens, 1))
            teacher = Observation(alone.tokens, {t: top for t, top in forced.tops.items() if t < len(alone.tokens)},
                                  forced.answered)  # fmt: skip
            item = PromptRun(p, alone, again, teacher)
            await sequential(asker, item, engine, config, controls.get(p.key))
            items.append(item)
            done += 1
            context.progress(done, total)
        if "batch" in config.conditions and items:
            await asker.timed("batch", batch(asker, items, config))
            done += len(items)
            context.progress(done, total)
        if "prefix_family" in config.conditions and items:
            await asker.timed("prefix_family", family(asker, items, engine, config))
            done += len(items)
            context.progress(done, total)
        share = {name: s / len(items) for name, s in asker.seconds.items()} if items else {}
        samples = [
            _sample(item, config, engine, controls.get(item.prompt.key), stored.get(item.prompt.key, {}), share,
                    context.engine_change)
            for item in items
        ]  # fmt: skip
        context.emit_samples(samples)
        return samples, 0


def run(context: SuiteContext) -> SuiteOutcome:
    samples, reused = asyncio.run(_run(context))
    rows = [r for s in samples for r in s.data["conditions"].values() if "skipped" not in r]
    per: dict[str, list[float]] = {}
    for s in samples:
        for name, r in s.data["conditions"].items():
            if "skipped" not in r:
                per.setdefault(name, []).append(r["drift"]["mean_kl"])
    finite = all(s.data["finite"] for s in samples)
    value = max((math.fsum(v) / len(v) for v in per.values()), default=0.0) if finite else NOT_FINITE
    empty = sum(1 for s in samples if not s.data["tokens"])
    return SuiteOutcome(
        metrics=[MetricValue(name=METRIC, value=value, n=len(samples), direction="lower")],
        samples=samples,
        empty_response_rate=empty / len(samples) if samples else 1.0,
        details={"prompts": len(samples), "conditions": sorted(per), "rows": len(rows), "reused_samples": reused},
    )


DEFINITION = SuiteDefinition(
    name=NAME,
    config_model=InvarianceConfig,
    metrics=(MetricSpec(METRIC, INVARIANCE),),
    run=run,
    compares_outputs=True,
    judges_control_arm=True,
)
