"""Benchmark: dashboard pages from a real `kvcanary serve` on SQLite with 10,000 runs stored.

Seeds a fresh SQLite file (the embedded default) with runs spread over a year and a dozen
profiles, two metric rows each, and two runs of 1319 GSM8k samples (5-shot prompts of the
real length; one is the other's reference, 40 items flipped). Starts a real `kvcanary serve`
on it (worker off) and times each page over HTTP: the first request, then the median and the
slowest of `--requests` more. Targets: the runs page and the run page of the 1319-sample run
each answer in under 1 s; the other pages are printed for information.

    .venv/bin/python scripts/bench_dashboard.py [--runs 10000] [--requests 10]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from bench_postgres_api import serve  # the same `kvcanary serve` start-up as the API benchmark
from sqlalchemy import create_engine, insert

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals.kinds.accuracy import judge_accuracy  # noqa: E402
from evals.records import MetricValue, Sample  # noqa: E402
from evals.verdict import Baseline, run_verdict  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402
from service.db.models import Run, SuiteResult  # noqa: E402
from service.db.session import session_scope  # noqa: E402
from service.runs import store  # noqa: E402

TARGET_S = 1.0
BASELINE = Baseline(0.8711, "higher", "absolute", 0.08, "vLLM PR #47671")
ITEMS = 1319
PROFILES = [f"model-{i:02d}" for i in range(12)]
STATUSES = ["passed"] * 70 + ["failed"] * 14 + ["error"] * 8 + ["cancelled"] * 5 + ["queued", "running", "scoring"]
TRIGGERS = ["ci"] * 6 + ["nightly"] * 3 + ["manual"]
FEWSHOT = "".join(
    f"Question: {'Natalia sold clips to 48 of her friends in April, and then she sold half as many in May. ' * 2}"
    f"How many clips did Natalia sell altogether in April and May?\nAnswer: Natalia sold 48/2 = <<48/2=24>>24 "
    f"clips in May. Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May. #### 72\n\n"
    for _ in range(5)
)


def seed_runs(url: str, runs: int, rng: random.Random) -> None:
    """`runs` runs with two GSM8k metric rows each, inserted in batches of 1,000."""
    engine = create_engine(url)
    start = datetime.now(UTC) - timedelta(days=365)
    with engine.begin() as connection:
        for first in range(1, runs + 1, 1000):
            run_rows: list[dict[str, Any]] = []
            result_rows: list[dict[str, Any]] = []
            for run_id in range(first, min(first + 1000, runs + 1)):
                status = rng.choice(STATUSES)
                created = start + timedelta(minutes=52 * run_id)
                finished = status in {"passed", "failed", "error", "cancelled"}
                run_rows.append(
                    {
                        "id": run_id,
                        "profile": rng.choice(PROFILES),
                        "status": status,
                        "trigger": rng.choice(TRIGGERS),
                        "triggered_by": rng.choice(["github-actions", "buildkite", "scheduler", "alice"]),
                        "labels": {
                            "git_sha": f"{rng.getrandbits(48):012x}",
                            "vllm_version": rng.choice(["0.24.1", "0.24.2", "0.25.0"]),
                            "build_url": f"https://ci.example.com/builds/{run_id}",
                        },
                        "created_at": created,
                        "started_at": created + timedelta(minutes=2) if status != "queued" else None,
                        "finished_at": created + timedelta(minutes=rng.randint(20, 240)) if finished else None,
                        "progress_done": 1319 if finished else rng.randint(0, 1319),
                        "progress_total": 1319,
                        "progress_phase": "gsm8k",
                        "phase_started_at": created + timedelta(minutes=3),
                        "verdict": {"passed": "pass", "failed": "fail"}.get(status),
                        "verdict_summary": "pass: gsm8k.strict-match 0.8704: pass",
                        "engine": {"fixed": {"version": "0.24.2", "gpu": "NVIDIA H200", "receipts": []}},
                        "log_tail": "INFO engine up\n" * 80 if finished else "",
                    }
                )
                if status not in {"passed", "failed"}:
                    continue
                for metric in ("strict-match", "flexible-extract"):
                    value = rng.uniform(0.80, 0.88) if status == "passed" else rng.uniform(0.55, 0.79)
                    result_rows.append(
                        {
                            "run_id": run_id,
                            "arm": "fixed",
                            "suite": "gsm8k",
                            "metric": metric,
                            "value": value,
                            "stderr": 0.009,
                            "ci_low": value - 0.018,
                            "ci_high": value + 0.018,
                            "n": ITEMS,
                            "direction": "higher",
                            "baseline_value": 0.8711,
                            "threshold": 0.7911,
                            "verdict": "pass" if status == "passed" else "fail",
                            "explanation": "PASS: meets the threshold; exact McNemar p=0.74",
                            "details": {"flips_down": 12, "flips_up": 11},
                        }
                    )
            connection.execute(insert(Run), run_rows)
            connection.execute(insert(SuiteResult), result_rows)
    engine.dispose()


def _item(i: int, right: bool, rng: random.Random) -> Sample:
    answer = str(rng.randint(1, 999)) if not right else str(i)
    working = " ".join(
        f"Step {s}: {rng.randint(1, 99)} + {rng.randint(1, 99)} = {rng.randint(2, 99)}." for s in range(8)
    )
    return Sample(
        key=f"gsm8k-{i:04d}",
        prompt_hash=f"{i:064x}",
        prompt=FEWSHOT + f"Question: In item {i}, how many marbles are left after the trades?\nAnswer:",
        target=str(i),
        response=f"{working} The answer is {answer}.",
        extracted={"strict-match": answer, "flexible-extract": answer},
        correct={"strict-match": right, "flexible-extract": right},
    )


def seed_sample_runs(url: str, rng: random.Random) -> tuple[int, int]:
    """A reference run and a candidate of 1319 samples each, 40 items flipped, judged as scoring does."""
    ids: list[int] = []
    flipped = set(rng.sample(range(ITEMS), 40))
    reference: dict[str, bool] | None = None
    for candidate in (False, True):
        with session_scope(url) as session:
            now = datetime.now(UTC)
            run = Run(profile=PROFILES[0], status="passed", trigger="ci", started_at=now, finished_at=now)
            run.engine = {"fixed": {"version": "0.24.2", "gpu": "NVIDIA H200", "receipts": [{"role": "engine_core"}]}}
            run.log_tail = "INFO Avg prompt throughput: 9000.0 tokens/s\n" * 80
            session.add(run)
            session.flush()
            items = [_item(i, (i % 7 != 0) != (candidate and i in flipped), rng) for i in range(ITEMS)]
            store.save_samples(session, run.id, "fixed", "gsm8k", "strict-match", items)
            judgements = []
            for metric in ("strict-match", "flexible-extract"):
                flags = {item.key: item.correct[metric] for item in items}
                judgement = judge_accuracy("gsm8k", metric, flags, BASELINE, reference)
                value = MetricValue(metric, judgement.value, judgement.n, None, None, None, "higher")
                store.save_result(session, run, "fixed", "gsm8k", value, 0.0, judgement)
                judgements.append(judgement)
            run.verdict = run_verdict(judgements)
            reference = {item.key: item.correct["strict-match"] for item in items}
            ids.append(run.id)
    return ids[0], ids[1]


def time_pages(url: str, pages: dict[str, str], requests: int) -> dict[str, tuple[float, list[float], int]]:
    """Per page: the first request's seconds, the later ones', and the body size."""
    found = {}
    with httpx.Client(base_url=url, timeout=60) as client:
        for name, path in pages.items():
            began = time.perf_counter()
            first = client.get(path)
            cold = time.perf_counter() - began
            first.raise_for_status()
            warm = []
            for _ in range(requests):
                began = time.perf_counter()
                client.get(path).raise_for_status()
                warm.append(time.perf_counter() - began)
            found[name] = (cold, warm, len(first.content))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=10, help="timed requests per page after the first")
    args = parser.parse_args()
    rng = random.Random(20261130)
    with tempfile.TemporaryDirectory(prefix="kvc-bench-db-") as folder:
        database_url = f"sqlite:///{Path(folder) / 'kvcanary.db'}"
        upgrade(database_url)
        began = time.monotonic()
        seed_runs(database_url, args.runs, rng)
        reference, candidate = seed_sample_runs(database_url, rng)
        print(f"seeded {args.runs} runs and 2 x {ITEMS} samples in {time.monotonic() - began:.1f} s (SQLite)")
        targets = {
            f"runs page ({args.runs + 2} runs)": "/runs",
            f"run page ({ITEMS} samples)": f"/runs/{candidate}",
        }
        others = {
            "runs page, last page": f"/runs?offset={args.runs - 25}",
            "runs page, 2 filters": f"/runs?profile={PROFILES[3]}&status=failed",
            "runs page, label filter": "/runs?label=vllm_version=0.25.0",
            "live poll (JSON, 50 runs)": "/api/v1/runs?limit=50",
            "samples page (wrong first)": f"/runs/{candidate}/samples",
            "samples page, search": f"/runs/{candidate}/samples?q=marbles",
            f"compare page ({ITEMS} vs {ITEMS})": f"/compare/{reference}/{candidate}",
            "diff API": f"/api/v1/runs/{reference}/diff/{candidate}",
            "profile page (200-run trends)": f"/profiles/{PROFILES[0]}",
            "profiles page": "/profiles",
        }
        with serve(database_url) as url:
            timings = time_pages(url, {**targets, **others}, args.requests)
    print(f"{args.requests} requests per page after the first; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'page':<34} {'first s':>8} {'p50 s':>8} {'max s':>8} {'KiB':>7} {'max/target':>11}")
    for name, (cold, warm, size) in timings.items():
        slowest = max([cold, *warm])
        mark = f"{slowest / TARGET_S:10.2f}x" if name in targets else ""
        print(f"{name:<34} {cold:8.3f} {statistics.median(warm):8.3f} {slowest:8.3f} {size / 1024:7.0f} {mark:>11}")
    for name in targets:
        slowest = max([timings[name][0], *timings[name][1]])
        verdict = "meets" if slowest < TARGET_S else "MISSES"
        print(f"{name}: slowest {slowest:.3f} s; {verdict} the target of {TARGET_S:.0f} s")


if __name__ == "__main__":
    main()
