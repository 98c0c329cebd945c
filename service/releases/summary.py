"""The release summary, read from stored runs and results and what their ends computed (nothing is run again).

A release is every run carrying one label value (`vllm_version=0.25.1`, `git_sha=3f2a9c1`).
Per profile its latest decided gate-grade run (passed, failed or errored) speaks for it
(`service.releases.decision`); a newer one still going is noted, not waited for, and runs that
may not decide are listed as exploratory. Which profiles a release needs is configured
(`KVCANARY_RELEASE_REQUIRED_PROFILES`), never guessed from what happened to run. The previous
release is the value of the same key whose first run came last before this release's first
run, unless the caller names one; each profile's row is paired with the same profile's deciding
run there, through the same run diff the compare view shows, as stored when the later run ended
(`service.releases.comparison`). The mutation score is the batch record's stored matrix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

from sqlalchemy import ColumnElement, func, literal_column, select
from sqlalchemy.orm import Session, load_only

from evals import suites as suite_registry
from service.db.models import Run, SuiteResult
from service.profiles import Profile
from service.releases.comparison import comparison_of
from service.releases.decision import Decision, RunFacts, decide
from service.releases.schemas import (
    NOT_RUN,
    MetricOutcome,
    MutationScore,
    Outcome,
    ProfileRelease,
    ReleaseIndex,
    ReleaseListing,
    ReleaseRun,
    ReleaseState,
    ReleaseSummary,
    release_path,
)
from service.runs.batches import latest_batch
from service.runs.queries import label_is
from service.schemas import LABEL_KEY
from service.text import nfc

RUN_COLUMNS = (
    Run.id, Run.profile, Run.status, Run.verdict, Run.verdict_summary, Run.error, Run.labels, Run.arms,
    Run.overrides, Run.created_at, Run.finished_at, Run.triggered_by, Run.triggered_role, Run.exploratory,
)  # fmt: skip
INDEX_LIMIT = 50


class ReleaseNotFound(LookupError):
    """No run carries the label key, or the value: the message says which and what to try."""


@dataclass(frozen=True)
class Release:
    value: str
    first_run_at: datetime
    last_run_at: datetime
    runs: int


def parse_release(spec: str) -> tuple[str, str]:
    """`key=value` (the value may hold any printable characters, `=` and `/` included; read in NFC, as
    labels are stored) or ReleaseNotFound."""
    key, sep, value = spec.partition("=")
    if not sep or not re.match(LABEL_KEY, key):
        raise ReleaseNotFound(f"{spec[:80]!r} is not a release: write KEY=VALUE, e.g. vllm_version=0.25.1")
    return key, nfc(value)


def _value_of(key: str) -> ColumnElement[str]:
    return Run.labels[key].as_string()


def releases_of(session: Session, key: str) -> list[Release]:
    """Every value of `key` on stored runs, the newest release (by its first run) first."""
    value = _value_of(key)
    # Grouped by the output column's name: PostgreSQL binds the key in the select list and in a
    # GROUP BY expression as two parameters, and then cannot tell they are the same expression.
    rows = session.execute(
        select(value.label("release"), func.min(Run.created_at), func.max(Run.created_at), func.count())
        .where(value.is_not(None))
        .group_by(literal_column("release"))
    ).all()
    found = [Release(str(v), first, last, n) for v, first, last, n in rows]
    return sorted(found, key=lambda r: (r.first_run_at, r.value), reverse=True)


def _check_key(session: Session, key: str, setting_hint: str) -> None:
    if session.scalar(select(Run.id).where(_value_of(key).is_not(None)).limit(1)) is None:
        raise ReleaseNotFound(f"no run carries a label {key!r}; releases are labelled by {setting_hint}")


def _release_runs(session: Session, key: str, value: str) -> list[Run]:
    dialect = session.get_bind().dialect.name
    query = select(Run).where(label_is(dialect, key, value)).options(load_only(*RUN_COLUMNS, raiseload=True))
    return list(session.scalars(query.order_by(Run.id)))


def _decide(runs: Sequence[Run], gate_roles: Sequence[str]) -> Decision:
    facts = [RunFacts(r.id, r.status, r.verdict, r.exploratory, r.triggered_role) for r in runs]
    return decide(facts, gate_roles)


def _missing(profile: str, outcome: Outcome | None, reason: str, pending: int | None) -> str:
    if outcome == "inconclusive":
        return f"{profile} {reason}"
    return f"{profile} is still running (run #{pending})" if outcome == "running" else f"{profile} has not run"


def judge(
    required: Sequence[str], outcomes: dict[str, Outcome], reasons: dict[str, str], pending: dict[str, int]
) -> tuple[ReleaseState, str, list[str], list[str]]:
    """(state, the one line, blocking, missing): blocked names what failed, incomplete what has not run
    or was inconclusive (which never counts as passed)."""
    if not required:
        line = "incomplete: no profile is required for a release; name them in KVCANARY_RELEASE_REQUIRED_PROFILES"
        return "incomplete", line, [], []
    blocking = [f"{p} {reasons[p]}" for p in required if outcomes.get(p) in ("failed", "error")]
    missing = [
        _missing(p, outcomes.get(p), reasons.get(p, ""), pending.get(p))
        for p in required
        if outcomes.get(p, NOT_RUN) in ("running", NOT_RUN, "inconclusive")
    ]
    if blocking:
        tail = f"; also incomplete: {'; '.join(missing)}" if missing else ""
        return "blocked", f"blocked: {'; '.join(blocking)}{tail}", blocking, missing
    if missing:
        return "incomplete", f"incomplete: {'; '.join(missing)}", blocking, missing
    return "ready", f"ready: every required profile passed ({', '.join(required)})", blocking, missing


def _short_reason(decision: Decision) -> str:
    """The index's reason: which run failed or was inconclusive, and what does not lift it."""
    if decision.outcome == "inconclusive":
        return f"was inconclusive (run #{decision.decided}), which is not a pass"
    word = "errored" if decision.outcome == "error" else "failed"
    return f"{word} (run #{decision.decided}){decision.after()}"


def release_index(
    session: Session, key: str, required: Sequence[str], gate_roles: Sequence[str], limit: int = INDEX_LIMIT
) -> ReleaseIndex:
    """The newest `limit` releases of `key`, each judged from its runs' statuses (one query for all)."""
    newest = releases_of(session, key)[:limit]
    wanted = {r.value for r in newest}
    value = _value_of(key)
    columns = (value, Run.id, Run.profile, Run.status, Run.verdict, Run.exploratory, Run.triggered_role)
    rows = session.execute(select(*columns).where(value.in_(wanted)).order_by(Run.id)).all() if wanted else []
    by_release: dict[str, dict[str, list[RunFacts]]] = {}
    for label_value, run_id, profile, status, verdict, exploratory, role in rows:
        facts = RunFacts(run_id, status, verdict, exploratory, role)
        by_release.setdefault(label_value, {}).setdefault(profile, []).append(facts)
    listings = []
    for release in newest:
        outcomes: dict[str, Outcome] = {}
        reasons: dict[str, str] = {}
        pending: dict[str, int] = {}
        for profile, runs in by_release.get(release.value, {}).items():
            decision = decide(runs, gate_roles)
            outcomes[profile] = decision.outcome
            if decision.decided is not None:
                reasons[profile] = _short_reason(decision)
            if decision.pending is not None:
                pending[profile] = decision.pending
        state, line, _, _ = judge(required, outcomes, reasons, pending)
        listings.append(
            ReleaseListing(
                value=release.value, state=state, line=line, runs=release.runs,
                profiles=sorted(by_release.get(release.value, {})), first_run_at=release.first_run_at,
                last_run_at=release.last_run_at, link=f"/releases/{release_path(key, release.value)}",
            )
        )  # fmt: skip
    return ReleaseIndex(key=key, required=list(required), releases=listings)


def _mutation_score(session: Session, profile: str, base_url: str) -> MutationScore | None:
    """The profile's latest mutation batch record summed up (its matrix computed when its run ended);
    the gate's own score, not the release's."""
    batch = latest_batch(session, profile)
    if batch is None:
        return None
    matrix = batch.matrix or {}
    return MutationScore(
        batch=batch.batch, started_by=batch.started_by, started_role=batch.started_role,
        started_at=batch.started_at, caught=int(matrix.get("caught", 0)), judged=int(matrix.get("judged", 0)),
        mutants=len(batch.mutants), link=f"{base_url}/profiles/{quote(profile)}#mutants",
    )  # fmt: skip


def _arms(run: Run, results: Sequence[SuiteResult], profile: Profile | None) -> list[str]:
    found = list(dict.fromkeys(r.arm for r in results))
    if found:
        return found
    if run.arms:
        return [str(arm["name"]) for arm in run.arms]
    return [profile.kernels.variant] if profile is not None else []


def _metrics(run: Run, results: Sequence[SuiteResult], profile: Profile | None) -> list[MetricOutcome]:
    """Each stored result, and a "not_run" entry per arm for every suite of the profile with none."""
    out = [
        MetricOutcome(
            arm=r.arm, suite=r.suite, metric=r.metric, value=r.value, n=r.n, ci_low=r.ci_low, ci_high=r.ci_high,
            direction=r.direction, baseline=r.baseline_value, threshold=r.threshold, verdict=r.verdict or "none",
            explanation=r.explanation, shown=suite_registry.shown(r.suite, r.metric, r.value, r.details),
            baseline_shown=suite_registry.shown(r.suite, r.metric, r.baseline_value, None),
            threshold_shown=suite_registry.shown(r.suite, r.metric, r.threshold, None),
        )
        for r in results
    ]  # fmt: skip
    suites = [entry.suite for entry in profile.suites] if profile is not None else []
    for arm in _arms(run, results, profile):
        for suite in suites:
            if not any(r.arm == arm and r.suite == suite for r in results):
                out.append(
                    MetricOutcome(
                        arm=arm, suite=suite, metric=None, value=None, n=None, ci_low=None, ci_high=None,
                        direction=None, baseline=None, threshold=None, verdict=NOT_RUN, explanation="",
                    )
                )  # fmt: skip
    return out


def _reasons(run: Run, metrics: Sequence[MetricOutcome], decision: Decision) -> list[str]:
    """Why a failed, errored or inconclusive run did: its failing metrics (the arm named where it had
    several, each value as its kind writes it), or its error; then the newer runs that do not decide."""
    if run.status == "error":
        first = (run.error or "no error recorded").strip().splitlines()[0][:300]
        return [f"errored (run #{run.id}): {first}{decision.after()}"]
    if decision.outcome != "inconclusive" and run.status != "failed":
        return []  # a passed A/B run's control arm may fail as the run expected
    arms = {m.arm for m in metrics}
    reasons = []
    for m in metrics:
        if m.verdict == "inconclusive" and decision.outcome == "inconclusive":
            arm = f" [{m.arm}]" if len(arms) > 1 else ""
            reasons.append(f"{m.suite}.{m.metric}{arm} {m.shown} on {m.n} items")
        elif m.verdict == "fail":
            arm = f" [{m.arm}]" if len(arms) > 1 else ""
            line = f" (pass line {m.threshold_shown})" if m.threshold is not None else ""
            reasons.append(f"{m.suite}.{m.metric}{arm} {m.shown}{line}")
    if decision.outcome == "inconclusive":
        return [f"was inconclusive (run #{run.id}), which is not a pass: {', '.join(reasons) or run.verdict_summary}"]
    return [f"failed (run #{run.id}): {', '.join(reasons) or run.verdict_summary}{decision.after()}"]


def deciding_run(session: Session, key: str, value: str, profile: str, gate_roles: Sequence[str]) -> Run | None:
    """The run that decides `profile`'s row in release key=value, if one does."""
    runs = [run for run in _release_runs(session, key, value) if run.profile == profile]
    decided = _decide(runs, gate_roles).decided
    return next((run for run in runs if run.id == decided), None)


def next_release(session: Session, key: str, value: str) -> str | None:
    """The value whose previous release `value` is: the one whose first run came next."""
    releases = releases_of(session, key)
    at = next((i for i, r in enumerate(releases) if r.value == value), None)
    return releases[at - 1].value if at else None


def previous_release(session: Session, key: str, value: str) -> str | None:
    """The value whose first run came last before `value`'s first run."""
    releases = releases_of(session, key)
    mine = next((r for r in releases if r.value == value), None)
    if mine is None:
        return None
    earlier = [r for r in releases if r.value != value and r.first_run_at <= mine.first_run_at]
    return earlier[0].value if earlier else None


def release_summary(
    session: Session,
    key: str,
    value: str,
    *,
    required: Sequence[str],
    gate_roles: Sequence[str],
    profiles: dict[str, Profile],
    previous: str | None = None,
    base_url: str = "",
) -> ReleaseSummary:
    """Every profile with runs labelled key=value (and every required one), judged from its gate-grade
    runs and paired with the previous release. ReleaseNotFound when no run has the key, the value, or
    the named previous value."""
    hint = "a key such as vllm_version or git_sha (see KVCANARY_RELEASE_LABEL)"
    _check_key(session, key, hint)
    runs = _release_runs(session, key, value)
    if not runs:
        recent = ", ".join(r.value for r in releases_of(session, key)[:5])
        raise ReleaseNotFound(f"no run is labelled {key}={value}; recent values of {key}: {recent}")
    named = previous is not None
    previous = nfc(previous) if previous is not None else previous_release(session, key, value)
    prev_runs = _release_runs(session, key, previous) if previous is not None else []
    if named and not prev_runs:
        raise ReleaseNotFound(f"no run is labelled {key}={previous} (the release to compare with)")
    by_profile: dict[str, list[Run]] = {}
    for run in runs:
        by_profile.setdefault(run.profile, []).append(run)
    prev_by_profile: dict[str, list[Run]] = {}
    for run in prev_runs:
        prev_by_profile.setdefault(run.profile, []).append(run)
    by_id = {run.id: run for run in [*runs, *prev_runs]}
    decisions = {p: _decide(rs, gate_roles) for p, rs in by_profile.items()}
    prev_decided = {p: _decide(rs, gate_roles).decided for p, rs in prev_by_profile.items()}
    prev_latest = {p: by_id[i] for p, i in prev_decided.items() if i is not None}
    chosen = [d.decided for d in decisions.values() if d.decided is not None]
    results: dict[int, list[SuiteResult]] = {}
    ordered = (SuiteResult.arm, SuiteResult.suite, SuiteResult.id)
    for row in session.scalars(select(SuiteResult).where(SuiteResult.run_id.in_(chosen)).order_by(*ordered)):
        results.setdefault(row.run_id, []).append(row)

    names = [*required, *sorted(p for p in by_profile if p not in required)]
    rows: list[ProfileRelease] = []
    outcomes: dict[str, Outcome] = {}
    reasons: dict[str, str] = {}
    pending: dict[str, int] = {}
    for name in names:
        decision = decisions.get(name, Decision(None, NOT_RUN, None))
        decided = by_id[decision.decided] if decision.decided is not None else None
        outcomes[name] = decision.outcome
        if decision.pending is not None:
            pending[name] = decision.pending
        metrics, why, comparison, note = [], [], None, ""
        if decided is not None:
            metrics = _metrics(decided, results.get(decided.id, []), profiles.get(name))
            why = _reasons(decided, metrics, decision)
            if why and decision.outcome in ("failed", "error", "inconclusive"):
                reasons[name] = why[0]
            before = prev_latest.get(name)
            if previous is None:
                note = f"no earlier release of {key}"
            elif before is None:
                note = f"no decided gate-grade run of {name} in {key}={previous}"
            else:
                comparison = comparison_of(session, before, decided, base_url)
        rows.append(
            ProfileRelease(
                profile=name, required=name in required, outcome=decision.outcome, runs=len(by_profile.get(name, [])),
                run=ReleaseRun.model_validate(decided, from_attributes=True) if decided is not None else None,
                pending_run_id=decision.pending, history=decision.history, exploratory=decision.exploratory,
                metrics=metrics, reasons=why, comparison=comparison, previous_note=note,
                mutation=_mutation_score(session, name, base_url),
            )
        )  # fmt: skip
    state, line, blocking, missing = judge(required, outcomes, reasons, pending)
    path = release_path(key, value)
    links = {"self": f"{base_url}/api/v1/releases/{path}", "dashboard": f"{base_url}/releases/{path}"}
    if previous is not None:
        links["previous"] = f"{base_url}/releases/{release_path(key, previous)}"
    return ReleaseSummary(
        key=key, value=value, state=state, line=line, blocking=blocking, missing=missing, required=list(required),
        previous=previous, previous_note="" if previous is not None else f"no release of {key} came before this one",
        profiles=rows, links=links,
    )  # fmt: skip
