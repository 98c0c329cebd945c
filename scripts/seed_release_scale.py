"""A release database at the mission's scale: 3,000 runs, 90 nightly releases, 10-arm mutation batches.

Two required GSM8k profiles (Kimi-Linear and Llama) run every night under the release label
`vllm_version`; each night's deciding run of each holds every item as a sample row, so the
release page pairs it with the night before. Around them stand what a real queue holds: CI smoke
runs with `limit` overrides, a failed nightly re-run every seventh night, a drift profile that is
not required, and filler runs of other profiles. Each required profile has one mutation batch of
`items` items x 10 arms (fixed and nine mutants: four caught at once, five that never fail, so a
per-read turning-point search walks every prefix).

Written with plain INSERTs for speed, on whichever schema the database has: where it keeps
batch records and gate-grade columns (migration 0011) they are filled in, and the batch's stored
matrix is computed the way a batch's end computes it, timed.

    python scripts/seed_release_scale.py sqlite:///tmp/release-scale.db [--items 1319]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, insert, inspect, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.auth import hash_token  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402

KEY = "vllm_version"
REQUIRED = ("gsm8k-kimi", "gsm8k-llama")
DRIFT, FILLER = "drift-nightly", "filler-model"
RELEASES = 90
TOTAL_RUNS = 3000
SMOKE_PER_PROFILE = 12
DRIFT_PER_RELEASE = 6
MUTANT_ARMS = 9  # plus fixed: 10 arms
CAUGHT_MUTANTS = 4
CI_TOKEN = "kvc_bench_ci_token_0123456789abcdef"
STRICT, FLEX = "strict-match", "flexible-extract"
PROFILE_YAML = (
    "description: GSM8k 5-shot, every item\nmodel: {model}\nserved_model_name: {name}\n"
    "engine: {{tensor_parallel_size: 1}}\nsuites: [{{suite: gsm8k}}]\n"
)


def release_value(night: int) -> str:
    return f"0.30.0.dev{night:03d}"


def write_profiles(folder: Path) -> None:
    """The profiles a served benchmark loads (a ci trigger needs one to exist)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*REQUIRED, DRIFT):
        (folder / f"{name}.yaml").write_text(PROFILE_YAML.format(model=f"bench/{name}", name=name))


class Seeder:
    def __init__(self, url: str, items: int, rng: random.Random) -> None:
        self.engine: Engine = create_engine(url)
        self.items = items
        self.rng = rng
        self.next_id = 1
        self.runs: list[dict[str, Any]] = []
        self.results: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        tables = inspect(self.engine).get_table_names()
        columns = {c["name"] for c in inspect(self.engine).get_columns("runs")}
        self.gate_columns = "exploratory" in columns
        self.batch_table = "mutation_batches" in tables
        self.deciding: dict[str, dict[str, int]] = {}
        self.batches: dict[str, int] = {}

    def run(self, profile: str, at: datetime, status: str, **extra: Any) -> int:
        run_id = self.next_id
        self.next_id += 1
        finished = status in ("passed", "failed", "error", "cancelled")
        row: dict[str, Any] = {
            "id": run_id, "profile": profile, "status": status, "trigger": extra.pop("trigger", "schedule"),
            "triggered_by": extra.pop("by", "scheduler"), "labels": extra.pop("labels", {}),
            "overrides": extra.pop("overrides", {}), "arms": extra.pop("arms", []), "created_at": at,
            "started_at": at + timedelta(minutes=1) if status != "queued" else None,
            "finished_at": at + timedelta(minutes=50) if finished else None,
            "duration_s": 2940.0 if finished else None, "attempt": 1, "progress_done": self.items,
            "progress_total": self.items, "progress_phase": "gsm8k",
            "verdict": {"passed": "pass", "failed": "fail"}.get(status), "verdict_summary": extra.pop("summary", ""),
            "error": "EngineDied: CUDA error: an illegal memory access" if status == "error" else "",
            "engine": {"fixed": {"version": "0.30.0", "gpu": "NVIDIA H200"}}, "log_tail": "INFO engine up\n" * 20,
            "expect": extra.pop("expect", None), "outcome": extra.pop("outcome", None),
        }  # fmt: skip
        role = extra.pop("role", "scheduler")
        exploratory = extra.pop("exploratory", "")
        if self.gate_columns:
            row["triggered_role"], row["exploratory"] = role, exploratory
        if extra:
            raise TypeError(f"unknown run fields {sorted(extra)}")
        self.runs.append(row)
        return run_id

    def result(self, run_id: int, arm: str, metric: str, value: float, verdict: str) -> None:
        self.results.append(
            {
                "run_id": run_id, "arm": arm, "suite": "gsm8k", "metric": metric, "value": value, "stderr": 0.009,
                "ci_low": value - 0.018, "ci_high": value + 0.018, "n": self.items, "direction": "higher",
                "baseline_value": 0.8711, "threshold": 0.7911, "verdict": verdict,
                "explanation": f"{verdict.upper()}: {value:.4f} against the pass line 0.7911", "details": {},
            }
        )  # fmt: skip

    def sample_rows(self, run_id: int, arm: str, flags: list[bool]) -> None:
        for i, right in enumerate(flags):
            answer = str(2 * i + 7) if right else str(2 * i + 6)
            self.samples.append(
                {
                    "run_id": run_id, "arm": arm, "suite": "gsm8k", "key": f"gsm8k-{i:04d}",
                    "prompt_hash": f"{i:064x}", "prompt": f"Question: Tom has {i} marbles and buys {i + 7} more.",
                    "target": str(2 * i + 7), "response": f"He has {answer}. #### {answer}",
                    "extracted": {STRICT: answer, FLEX: answer}, "correct": {STRICT: right, FLEX: right},
                    "is_correct": right, "error": None, "data": {}, "severity": 0.0 if right else 1.0,
                }
            )  # fmt: skip

    def scored(self, run_id: int, arm: str, flags: list[bool], passed: bool) -> None:
        value = sum(flags) / len(flags)
        for metric in (STRICT, FLEX):
            self.result(run_id, arm, metric, value, "pass" if passed else "fail")

    def flush(self) -> None:
        from service.db.models import Run, Sample, SuiteResult

        with self.engine.begin() as connection:
            for start in range(0, len(self.runs), 1000):
                connection.execute(insert(Run), self.runs[start : start + 1000])
            for start in range(0, len(self.results), 5000):
                connection.execute(insert(SuiteResult), self.results[start : start + 5000])
            for start in range(0, len(self.samples), 5000):
                connection.execute(insert(Sample), self.samples[start : start + 5000])
        self.runs, self.results, self.samples = [], [], []

    def nightly(self, night: int, at: datetime) -> None:
        """One night: smoke runs, the drift profile, and each required profile's deciding run."""
        value = release_value(night)
        self.deciding[value] = {}
        base = [self.rng.random() < 0.87 for _ in range(self.items)]
        for k in range(SMOKE_PER_PROFILE):
            for profile in REQUIRED:
                when = at + timedelta(minutes=5 * k)
                ok = self.rng.random() < 0.9
                run_id = self.run(
                    profile, when, "passed" if ok else "failed", trigger="ci", by="github-actions", role="ci",
                    labels={KEY: value, "git_sha": f"{self.rng.getrandbits(40):010x}"}, overrides={"limit": 20},
                    exploratory="limit 20 (the profile runs every item)",
                )  # fmt: skip
                self.scored(run_id, "fixed", [ok] * 20, ok)
        for k in range(DRIFT_PER_RELEASE):
            run_id = self.run(DRIFT, at + timedelta(hours=2, minutes=9 * k), "passed", labels={KEY: value})
            self.result(run_id, "fixed", "kl_mean", 1e-5 * (1 + k), "pass")
        for n, profile in enumerate(REQUIRED):
            when = at + timedelta(hours=3 + n)
            if night % 7 == 3:  # a failed nightly, then its re-run
                failed = self.run(profile, when, "failed", labels={KEY: value})
                self.scored(failed, "fixed", [False] * 10 + base[10:], False)
                when += timedelta(minutes=30)
            flags = [right != (self.rng.random() < 0.02) for right in base]
            run_id = self.run(profile, when, "passed", labels={KEY: value}, summary="pass: gsm8k.strict-match")
            self.scored(run_id, "fixed", flags, True)
            self.sample_rows(run_id, "fixed", flags)
            self.deciding[value][profile] = run_id

    def batch(self, profile: str, at: datetime) -> int:
        """One mutation batch of the profile: fixed plus nine mutant arms on every item."""
        from kernels.mutants import MUTANTS

        names = [*MUTANTS, *(f"heldout_{k:02d}" for k in range(MUTANT_ARMS))][:MUTANT_ARMS]
        batch = f"{at:%Y%m%dT%H%M%SZ}-{profile[-4:]}"
        arms = [{"name": arm, "variant": arm, "engine": {}} for arm in ("fixed", *names)]
        run_id = self.run(
            profile, at, "passed", trigger="manual", by="alice", role="admin", arms=arms,
            labels={"mutation_batch": batch}, exploratory="a mutation batch (arms fixed and mutants)",
            expect={"fixed": "pass", **{name: "fail" for name in names}}, outcome="as_expected",
        )  # fmt: skip
        fixed = [self.rng.random() < 0.87 for _ in range(self.items)]
        self.scored(run_id, "fixed", fixed, True)
        self.sample_rows(run_id, "fixed", fixed)
        for k, name in enumerate(names):
            caught = k < CAUGHT_MUTANTS
            flags = [right and (not caught or i % 3 == 0) for i, right in enumerate(fixed)]
            self.scored(run_id, name, flags, not caught)
            self.sample_rows(run_id, name, flags)
        self.batches[profile] = run_id
        if self.batch_table:
            self.flush()
            with self.engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO mutation_batches (batch, profile, run_id, started_by, started_role, started_at, "
                        "mutants) VALUES (:batch, :profile, :run_id, 'alice', 'admin', :at, :mutants)"
                    ),
                    {"batch": batch, "profile": profile, "run_id": run_id, "at": at, "mutants": json.dumps(names)},
                )
        return run_id

    def token(self) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO api_tokens (name, role, token_hash, created_at, revoked) "
                    "VALUES ('bench-ci', 'ci', :hash, :at, false)"
                ),
                {"hash": hash_token(CI_TOKEN), "at": datetime.now(UTC)},
            )


def seed(url: str, items: int) -> Seeder:
    """The whole database; returns the seeder (its `deciding` and `batches` name runs to read)."""
    upgrade(url)
    seeder = Seeder(url, items, random.Random(20261207))
    start = datetime.now(UTC) - timedelta(days=RELEASES + 2)
    for night in range(RELEASES):
        seeder.nightly(night, start + timedelta(days=night))
        if night % 10 == 9:
            seeder.flush()
    for n, profile in enumerate(REQUIRED):
        seeder.batch(profile, start + timedelta(days=RELEASES, hours=n))
    while seeder.next_id <= TOTAL_RUNS:
        at = start + timedelta(minutes=43 * seeder.next_id)
        run_id = seeder.run(FILLER, at, seeder.rng.choice(["passed", "passed", "failed", "error"]), trigger="ci")
        seeder.result(run_id, "fixed", STRICT, 0.8, "pass")
    seeder.flush()
    seeder.token()
    if seeder.batch_table:
        settle_all(url, seeder)
    return seeder


def settle_all(url: str, seeder: Seeder) -> None:
    """What each run's end computes once (`service.releases.settled`), in the order the runs ended."""
    from service.db.session import session_scope
    from service.releases.settled import settle_release
    from service.runs.batches import settle_run
    from service.settings import GATE_ROLES

    began = time.perf_counter()
    for value in seeder.deciding:
        for run_id in seeder.deciding[value].values():
            with session_scope(url) as session:
                settle_release(session, run_id, KEY, GATE_ROLES)
    runs = sum(len(v) for v in seeder.deciding.values())
    print(f"release comparisons computed at {runs} deciding runs' ends in {time.perf_counter() - began:.1f} s")
    for profile, run_id in seeder.batches.items():
        began = time.perf_counter()
        with session_scope(url) as session:
            settle_run(session, run_id)
        print(f"{profile}: batch matrix computed at the batch's end in {time.perf_counter() - began:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="SQLAlchemy URL of an empty database")
    parser.add_argument("--items", type=int, default=1319)
    args = parser.parse_args()
    began = time.perf_counter()
    seeder = seed(args.url, args.items)
    print(f"seeded {seeder.next_id - 1} runs in {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
