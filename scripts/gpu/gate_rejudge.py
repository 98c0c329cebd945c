"""Judge a gate's stored runs again with today's verdict rules and profile baselines.

Verdicts are computed from the stored per-sample rows, so a change to a rule or a baseline can
be checked against runs already made without a GPU: this copies the run database a GPU host's
`scripts/gpu/gate_e2e.sh run` left, replaces its baselines with the packaged profiles' ones,
scores every finished run again through the service's own scoring, and prints the gate table
with each row's check. The original database is not touched.

Samples stored before the verdicts held an arm against its control lack what those rules read;
the copy gets it first (`backfill`): each later arm's `engine_change` from the run's arms, an
invariance sample's control rows per condition, and a drift candidate's rows compared again from
its stored outputs (their per-position tails). `--kernel-only` judges every later arm as if it
changed its kernels alone: on A/A runs (fresh engines of one variant, made distinct by an
unreached prefill budget) it shows what the kernel-only rules would say of identical kernels,
the false-alarm check.

    python scripts/gpu/gate_rejudge.py OUT/kvcanary.db [--save rejudged.db] [--kernel-only]
"""

from __future__ import annotations

import argparse
import copy
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from evals import invariance
from evals.records import MetricValue
from evals.suites.base import SuiteOutcome
from evals.suites.drift import recompare
from service import baselines
from service.arms import engine_change, run_arms
from service.db.migrate import upgrade
from service.db.models import Baseline, BaselineChange, Run, SuiteResult
from service.db.models import Sample as SampleRow
from service.db.session import session_scope
from service.profiles import Profile, load_profiles
from service.runs import queries, scoring, store
from service.settings import PACKAGED_PROFILES

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gate_e2e


def _outcomes(session: object, run: Run) -> dict[tuple[str, str], SuiteOutcome]:
    rows = list(session.scalars(select(SuiteResult).where(SuiteResult.run_id == run.id)))  # type: ignore[attr-defined]
    grouped: dict[tuple[str, str], list[SuiteResult]] = {}
    for row in rows:
        grouped.setdefault((row.arm, row.suite), []).append(row)
    return {
        key: SuiteOutcome(
            metrics=[MetricValue(r.metric, r.value, r.n, r.stderr, r.ci_low, r.ci_high, r.direction) for r in found],
            samples=[],
            empty_response_rate=found[0].empty_response_rate,
        )
        for key, found in grouped.items()
    }


def backfill(session: Any, run: Run, profile: Profile, kernel_only: bool) -> int:
    """Give a run's later arms what the control rules read where their samples lack it; returns how
    many samples changed."""
    specs = run_arms(run.arms or [], profile)
    if len(specs) < 2:
        return 0
    control, changed = specs[0], 0
    for spec in specs[1:]:
        change = {} if kernel_only else engine_change(profile, spec, control)
        for suite in ("drift", "invariance"):
            theirs = store.load_samples(session, run.id, control.name, suite)
            rows = session.scalars(select(SampleRow).where(
                SampleRow.run_id == run.id, SampleRow.arm == spec.name, SampleRow.suite == suite))  # fmt: skip
            for row in rows:
                data = copy.deepcopy(row.data)
                if suite == "invariance" and row.key in theirs:
                    invariance.attach_control(data["conditions"], theirs[row.key].data.get("conditions") or {})
                if suite == "drift" and data.get("reference") and row.key in theirs:
                    data = dict(recompare(store.to_suite_sample(row), theirs[row.key]).data)
                data["engine_change"] = change if kernel_only else data.get("engine_change", change)
                if data != row.data:
                    row.data, changed = data, changed + 1
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", type=Path)
    parser.add_argument("--save", type=Path, help="keep the re-judged copy here")
    parser.add_argument("--kernel-only", action="store_true", help="judge every later arm as a kernel-only change")
    args = parser.parse_args()
    profiles = load_profiles(PACKAGED_PROFILES)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "kvcanary.db"
        with sqlite3.connect(args.database) as source, sqlite3.connect(copy) as target:
            source.backup(target)  # a live database's last writes may be in its WAL
        url = f"sqlite:///{copy}"
        upgrade(url)
        with session_scope(url) as session:
            session.execute(delete(BaselineChange))
            session.execute(delete(Baseline))
            baselines.seed_from_profiles(session, profiles)
            runs = list(session.scalars(select(Run).order_by(Run.id)))
            filled = sum(backfill(session, run, profiles[run.profile], args.kernel_only) for run in runs)
            print(f"backfilled {filled} samples for the control rules")
            jobs = [(run.id, run.profile, [a["name"] for a in run.arms], _outcomes(session, run)) for run in runs]
        for run_id, profile, variants, outcomes in jobs:
            arms = variants or sorted({arm for arm, _ in outcomes})
            with session_scope(url) as session:
                run = session.get(Run, run_id)
                assert run is not None
                verdict, summary = scoring.score(session, run, profiles[profile], outcomes, arms)
                run.verdict, run.verdict_summary = verdict, summary
                if run.status in ("passed", "failed", "scoring"):  # an engine death stays an error
                    run.status = "failed" if verdict == "fail" else "passed"
        results = []
        with session_scope(url) as session:
            details = [queries.run_detail(session, run).model_dump(mode="json") for run in session.scalars(
                select(Run).order_by(Run.id))]  # fmt: skip
        for detail in details:
            row = next((r for r in gate_e2e.rows() if r.profile == detail["profile"] and _matches(r, detail)), None)
            if row is not None:
                results.append((row, detail, None, row.check(detail)))
        print(gate_e2e.table(results))
        if args.save:  # SQLite's backup: the re-judged rows may still be in the WAL
            with sqlite3.connect(copy) as source, sqlite3.connect(args.save) as saved:
                source.backup(saved)
    return 0 if all(not problems for *_, problems in results) else 1


def _matches(row: gate_e2e.Row, detail: dict[str, object]) -> bool:
    """A stored run is the row whose arms it ran (A/B, legacy, or the profile's own variant)."""
    variants = detail["variants"] or list(detail["engine"])  # type: ignore[call-overload]
    if "--compare" in row.args:
        return bool(detail["variants"])
    if "--variant" in row.args:
        return variants == [row.args[row.args.index("--variant") + 1]]
    return not detail["variants"] and variants == ["fixed"]


if __name__ == "__main__":
    raise SystemExit(main())
