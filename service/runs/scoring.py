"""Turn a run's stored samples and metrics into judged results and one run verdict.

Judgements are computed from the stored per-sample rows (every sample of the run, including
ones an earlier attempt stored), against the stored baseline and, where the baseline names a
reference run, against that run's samples on the same items. An A/B run is judged as the
paired comparison of each later arm against its first (the control).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from evals import suites as suite_registry
from evals.records import MetricValue, Sample
from evals.suites import shown
from evals.suites.base import SuiteOutcome
from evals.verdict import Baseline, MetricJudgement, judge_ab, run_verdict
from service.arms import arm_verdicts
from service.arms import outcome as expectation_outcome
from service.db.models import Baseline as BaselineRow
from service.db.models import Run, SuiteResult
from service.db.models import Sample as SampleRow
from service.profiles import Profile
from service.runs import store


def _no_samples(suite: str, metric: MetricValue) -> MetricJudgement:
    return MetricJudgement(
        suite=suite,
        metric=metric.name,
        verdict="fail",
        value=metric.value,
        n=0,
        baseline=None,
        threshold=None,
        explanation="no sample of this run was scored for this metric, so nothing supports its value",
        details={},
    )


def baseline_for(session: Session, profile: str, suite: str, metric: str) -> tuple[Baseline | None, int | None]:
    row = session.scalar(
        select(BaselineRow).where(
            BaselineRow.profile == profile, BaselineRow.suite == suite, BaselineRow.metric == metric
        )
    )
    if row is None:
        return None, None
    baseline = Baseline.stored(row.value, row.direction, row.tolerance_kind, row.tolerance, row.source)
    return baseline, row.reference_run_id


def reference_samples(session: Session, run_id: int | None, suite: str) -> dict[str, Sample] | None:
    """The samples of a reference run for one suite: its treatment arm, else its only arm."""
    if run_id is None:
        return None
    reference = session.get(Run, run_id)
    if reference is None:
        return None
    arm = (reference.arms or [{"name": None}])[-1]["name"] or _only_arm(session, run_id, suite)
    return store.load_samples(session, run_id, arm, suite) or None


def _only_arm(session: Session, run_id: int, suite: str) -> str:
    arm = session.scalar(select(SampleRow.arm).where(SampleRow.run_id == run_id, SampleRow.suite == suite).limit(1))
    return arm or ""


def _empty_rate_failure(judgement: MetricJudgement, rate: float, limit: float) -> MetricJudgement:
    return dataclasses.replace(
        judgement,
        verdict="fail",
        explanation=(
            f"{rate:.1%} of responses were empty, over the limit of {limit:.1%}: the engine answered "
            f"without text, which no score can be trusted on. " + judgement.explanation
        ),
        details={**judgement.details, "empty_response_rate": rate},
    )


def _judge(
    session: Session, run: Run, profile: Profile, suite: str, metric: MetricValue, samples: Mapping[str, Sample]
) -> MetricJudgement:
    """The metric's declared kind reads the samples and judges them against baseline and reference run."""
    kind = suite_registry.metric_kind(suite, metric.name)
    scores = kind.scores(samples, metric.name)
    if not scores:
        return _no_samples(suite, metric)
    baseline, reference_run = baseline_for(session, profile.name, suite, metric.name)
    reference = reference_samples(session, reference_run, suite) if reference_run != run.id else None
    reference_scores = kind.scores(reference, metric.name) if reference else None
    return kind.judge(suite, metric.name, scores, baseline, reference_scores)


def _judge_ab(
    session: Session,
    profile: Profile,
    suite: str,
    metric: MetricValue,
    control_arm: str,
    run: Run,
    samples: Mapping[str, Sample],
) -> MetricJudgement:
    """Treatment arm against the control arm on the same items; the baseline lends its tolerance."""
    kind = suite_registry.metric_kind(suite, metric.name)
    scores = kind.scores(samples, metric.name)
    if not scores:
        return _no_samples(suite, metric)
    control = kind.scores(store.load_samples(session, run.id, control_arm, suite), metric.name)
    baseline, _ = baseline_for(session, profile.name, suite, metric.name)
    return judge_ab(suite, metric.name, kind.judge, control, scores, baseline=baseline, control_label=control_arm)


def _from_pairing(explanation: str, control_arm: str) -> str:
    """The paired judgement's own sentences, from where it names the control arm."""
    start = explanation.find(f"Against the {control_arm} arm")
    return explanation[start:] if start >= 0 else explanation


def _with_pairing(base: MetricJudgement, paired: MetricJudgement, control_arm: str) -> MetricJudgement:
    """The treatment arm's judgement: its baseline decides, and a significant regression against
    the control arm fails it too. An inconclusive pairing does not undo a decided baseline (a
    control that fails its own baseline cannot certify anything); without a baseline value the
    pairing alone decides. The baseline's numbers stay; the deciding text comes first."""
    if base.verdict == "no_baseline":
        return paired
    details = {**base.details, **{f"paired_{key}": value for key, value in paired.details.items()}}
    if paired.verdict == "fail":
        return dataclasses.replace(
            base, verdict="fail", details=details, explanation=f"{paired.explanation} Its baseline: {base.explanation}"
        )
    return dataclasses.replace(
        base,
        details=details,
        explanation=f"{base.explanation} Paired ({paired.verdict}): {_from_pairing(paired.explanation, control_arm)}",
    )


def score(
    session: Session, run: Run, profile: Profile, outcomes: Mapping[tuple[str, str], SuiteOutcome], arms: list[str]
) -> tuple[str, str]:
    """Judge and store every metric of every arm that finished; return (run verdict, summary).

    Every arm is held to the profile's baseline (and reference run); in an A/B run each later
    arm is also paired with the first on the same items, and the worse judgement decides. An
    arm whose engine died has no outcome here: the other is judged against the baseline alone.
    """
    judgements: list[tuple[str, MetricJudgement]] = []
    for (arm, suite), outcome in outcomes.items():
        samples = store.load_samples(session, run.id, arm, suite)
        limit = profile.suite_configs()[suite].max_empty_response_rate
        control = arms[0] if len(arms) > 1 and arm != arms[0] and (arms[0], suite) in outcomes else None
        compares = suite_registry.get(suite).compares_outputs
        own_findings = suite_registry.get(suite).judges_control_arm
        for metric in outcome.metrics:
            if compares and not own_findings and len(arms) > 1 and arm == arms[0]:
                # a suite that compares outputs judges the later arms against this one's inside
                store.save_result(session, run, arm, suite, metric, outcome.empty_response_rate, None)
                continue
            judgement = _judge(session, run, profile, suite, metric, samples)
            if control is not None and not compares:
                paired = _judge_ab(session, profile, suite, metric, control, run, samples)
                judgement = _with_pairing(judgement, paired, control)
            if outcome.empty_response_rate > limit:
                judgement = _empty_rate_failure(judgement, outcome.empty_response_rate, limit)
            if len(arms) == 1 or judgement.verdict != "no_baseline" or control is not None:
                judgements.append((arm, judgement))
            store.save_result(session, run, arm, suite, metric, outcome.empty_response_rate, judgement)
    verdict = run_verdict([j for _, j in judgements])
    prefix = (lambda arm: f"{arm}/") if len(arms) > 1 else (lambda arm: "")
    summary = (
        "; ".join(
            f"{prefix(arm)}{j.suite}.{j.metric} {shown(j.suite, j.metric, j.value, j.details)}: {j.verdict}"
            for arm, j in judgements
        )
        or "no metrics were judged"
    )
    return verdict, f"{verdict}: {summary}"


def judge_arms(session: Session, run: Run, arms: list[str], dead: list[str]) -> None:
    """Store each arm's verdict (service.arms: fail if any of its metrics failed, error if its
    engine died) and, where the run has expectations, its outcome."""
    verdicts = select(SuiteResult.arm, SuiteResult.verdict)
    judged = session.execute(verdicts.where(SuiteResult.run_id == run.id, SuiteResult.verdict.is_not(None))).all()
    run.arm_verdicts = arm_verdicts(arms, [(arm, str(verdict)) for arm, verdict in judged], dead)
    run.outcome = expectation_outcome(run.expect, run.arm_verdicts) if run.expect else None
