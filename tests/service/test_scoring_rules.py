"""Scoring's combining rules on real database rows (SQLite and PostgreSQL), without an engine:
which arm's judgement counts, and how per-arm verdicts become a run's outcome. How a whole run
gets there is test_pipeline_orchestration.py."""

from __future__ import annotations

from sqlalchemy import select

from evals.records import MetricValue, Sample
from evals.suites.base import SuiteOutcome
from service import baselines
from service.arms import describe_outcome
from service.db.models import Run, SuiteResult
from service.db.session import session_scope
from service.profile_snapshot import snapshot_of
from service.profiles import ArmSpec
from service.runs import queue, scoring, store
from tests.conftest import MakeProfile

CHUNKED = "fixed,max_num_batched_tokens=64"


def test_an_arm_fails_when_any_of_its_metrics_fails_and_errors_when_its_engine_died(database_url: str) -> None:
    with session_scope(database_url) as session:
        run, _ = queue.enqueue(
            session,
            profile="p",
            trigger="ci",
            triggered_by="t",
            labels={},
            overrides={},
            arms=[ArmSpec.model_validate(a).stored() for a in ("fixed", CHUNKED, "legacy")],
            expect={"fixed": "pass", CHUNKED: "fail", "legacy": "fail"},
            max_attempts=1,
        )
        session.flush()
        rows = [("fixed", "gsm8k", "pass"), ("fixed", "drift", None), (CHUNKED, "gsm8k", "inconclusive")]
        rows += [(CHUNKED, "drift", "fail"), ("legacy", "gsm8k", "pass")]
        for arm, suite, verdict in rows:
            session.add(SuiteResult(run_id=run.id, arm=arm, suite=suite, metric="m", value=1.0, n=1, verdict=verdict))
        run_id = run.id
    with session_scope(database_url) as session:
        stored = session.get(Run, run_id)
        assert stored is not None
        scoring.judge_arms(session, stored, ["fixed", CHUNKED, "legacy"], dead=["legacy"])
        assert stored.arm_verdicts == {"fixed": "pass", CHUNKED: "fail", "legacy": "error"}
        assert stored.outcome == "unexpected"
        assert describe_outcome(stored.expect, stored.arm_verdicts) == (
            "unexpected: legacy was expected to fail and errored (its engine died)"
        )
    assert describe_outcome({"fixed": "pass", CHUNKED: "fail"}, {"fixed": "pass", CHUNKED: "fail"}) == (
        f"as expected: fixed passed, {CHUNKED} failed"
    )


def test_a_comparing_suite_is_judged_on_the_later_arm_and_stored_unjudged_on_the_control(
    database_url: str, make_profile: MakeProfile
) -> None:
    profile = make_profile("stand-in-model", name="drift-rules", suites=[{"suite": "drift", "limit": 2}])
    kl = SuiteOutcome(metrics=[MetricValue("kl", 0.0, 2, direction="lower")], samples=[], empty_response_rate=0.0)
    with session_scope(database_url) as session:
        run, _ = queue.enqueue(
            session, profile=profile.name, trigger="ci", triggered_by="t", labels={}, overrides={},
            arms=[ArmSpec.model_validate(a).stored() for a in ("fixed", "legacy")], max_attempts=1,
            profile_snapshot=snapshot_of(profile),
        )  # fmt: skip
        session.flush()
        verdict, summary = scoring.score(
            session, run, profile, {("fixed", "drift"): kl, ("legacy", "drift"): kl}, ["fixed", "legacy"]
        )
        scoring.judge_arms(session, run, ["fixed", "legacy"], [])
        judged = {
            (r.arm, r.metric): r for r in session.scalars(select(SuiteResult).where(SuiteResult.run_id == run.id))
        }
        assert run.arm_verdicts == {"fixed": "pass", "legacy": "fail"}
    assert judged[("fixed", "kl")].verdict is None  # the control is what the later arm is compared with
    assert judged[("legacy", "kl")].verdict == "fail"  # no stored comparison supports its value
    assert verdict == "fail" and summary.startswith("fail: legacy/drift.kl") and "fixed/" not in summary


def test_too_many_empty_answers_fail_a_metric_its_baseline_passes(database_url: str, make_profile: MakeProfile) -> None:
    tolerance = {"kind": "absolute", "value": 0.5}
    profile = make_profile(
        "stand-in-model",
        name="empty-rule",
        baselines={"gsm8k": {"strict-match": {"value": 1.0, "tolerance": tolerance}}},
    )
    right = [
        Sample(key=f"q{i}", prompt_hash=f"h{i}", target="4", response="#### 4", correct={"strict-match": True})
        for i in range(10)
    ]
    outcome = SuiteOutcome(metrics=[MetricValue("strict-match", 1.0, 10)], samples=right, empty_response_rate=0.3)
    with session_scope(database_url) as session:
        baselines.seed_from_profiles(session, {profile.name: profile})
        run, _ = queue.enqueue(
            session, profile=profile.name, trigger="ci", triggered_by="t", labels={}, overrides={}, arms=[],
            max_attempts=1, profile_snapshot=snapshot_of(profile),
        )  # fmt: skip
        session.flush()
        store.save_samples(session, run.id, "fixed", "gsm8k", "strict-match", right)
        verdict, summary = scoring.score(session, run, profile, {("fixed", "gsm8k"): outcome}, ["fixed"])
        judged = session.scalars(select(SuiteResult).where(SuiteResult.run_id == run.id)).one()
    assert verdict == "fail" and summary == "fail: gsm8k.strict-match 1.0000: fail"
    assert judged.explanation.startswith("30.0% of responses were empty, over the limit of 20.0%")
    assert judged.details["empty_response_rate"] == 0.3 and judged.baseline_value == 1.0  # the baseline's numbers stay
