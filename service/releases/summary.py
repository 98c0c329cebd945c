"""The release summary, computed from stored runs, results and samples (nothing is run again).

A release is every run carrying one label value (`vllm_version=0.25.1`, `git_sha=3f2a9c1`).
Per profile its latest decided run (passed, failed or errored) speaks for it; a newer run still
going is noted, not waited for. Which profiles a release needs is configured
(`KVCANARY_RELEASE_REQUIRED_PROFILES`), never guessed from what happened to run. The previous
release is the value of the same key whose first run came last before this release's first
run, unless the caller names one; each profile's row is paired with the same profile's latest
decided run there, through the same run diff the compare view shows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

from sqlalchemy import ColumnElement, func, literal_column, select
from sqlalchemy.orm import Session, load_only

from evals import kinds
from evals.numbers import format_number
from service.db.models import Run, SuiteResult
from service.profiles import Profile
from service.releases.schemas import (
    NOT_RUN,
    Comparison,
    MetricChange,
    MetricOutcome,
    MutationScore,
    Outcome,
    PairedChange,
    ProfileRelease,
    ReleaseIndex,
    ReleaseListing,
    ReleaseRun,
    ReleaseState,
    ReleaseSummary,
    release_path,
)
from service.runs.compare import CompareError, SuiteDiff, arms_and_suites, diff_runs
from service.runs.mutation import latest_matrix
from service.runs.queries import label_is
from service.runs.state import Status
from service.schemas import LABEL_KEY

DECIDED = frozenset({Status.PASSED.value, Status.FAILED.value, Status.ERROR.value})
PENDING = frozenset(
    {Status.QUEUED.value, Status.STARTING_ENGINE.value, Status.RUNNING.value, Status.SCORING.value}
    | {Status.INTERRUPTED.value}
)
RUN_COLUMNS = (
    Run.id, Run.profile, Run.status, Run.verdict, Run.verdict_summary, Run.error, Run.labels, Run.arms,
    Run.overrides, Run.created_at, Run.finished_at,
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
    """`key=value` (the value may hold any printable characters, `=` and `/` included) or ReleaseNotFound."""
    key, sep, value = spec.partition("=")
    if not sep or not re.match(LABEL_KEY, key):
        raise ReleaseNotFound(f"{spec[:80]!r} is not a release: write KEY=VALUE, e.g. vllm_version=0.25.1")
    return key, value


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


def _latest(runs: Sequence[Run]) -> tuple[Run | None, Run | None]:
    """The newest decided run, and a newer run still queued or going (runs in id order)."""
    decided = next((r for r in reversed(runs) if r.status in DECIDED), None)
    pending = next((r for r in reversed(runs) if r.status in PENDING and (decided is None or r.id > decided.id)), None)
    return decided, pending


def _outcome(decided_status: str | None, pending: bool) -> Outcome:
    """A decided run's status (passed, failed, error), else running or not_run."""
    if decided_status is not None:
        return "passed" if decided_status == "passed" else "failed" if decided_status == "failed" else "error"
    return "running" if pending else NOT_RUN


def judge(
    required: Sequence[str], outcomes: dict[str, Outcome], reasons: dict[str, str], pending: dict[str, int]
) -> tuple[ReleaseState, str, list[str], list[str]]:
    """(state, the one line, blocking, missing): blocked names what failed, incomplete what has not run."""
    if not required:
        line = "incomplete: no profile is required for a release; name them in KVCANARY_RELEASE_REQUIRED_PROFILES"
        return "incomplete", line, [], []
    blocking = [f"{p} {reasons[p]}" for p in required if outcomes.get(p) in ("failed", "error")]
    missing = [
        f"{p} is still running (run #{pending[p]})" if outcomes.get(p) == "running" else f"{p} has not run"
        for p in required
        if outcomes.get(p, NOT_RUN) in ("running", NOT_RUN)
    ]
    if blocking:
        tail = f"; also incomplete: {'; '.join(missing)}" if missing else ""
        return "blocked", f"blocked: {'; '.join(blocking)}{tail}", blocking, missing
    if missing:
        return "incomplete", f"incomplete: {'; '.join(missing)}", blocking, missing
    return "ready", f"ready: every required profile passed ({', '.join(required)})", blocking, missing


def release_index(session: Session, key: str, required: Sequence[str], limit: int = INDEX_LIMIT) -> ReleaseIndex:
    """The newest `limit` releases of `key`, each judged from its runs' statuses (one query for all)."""
    newest = releases_of(session, key)[:limit]
    wanted = {r.value for r in newest}
    value = _value_of(key)
    rows = session.execute(
        select(value, Run.id, Run.profile, Run.status).where(value.in_(wanted)).order_by(Run.id)
    ).all() if wanted else []  # fmt: skip
    by_release: dict[str, dict[str, list[tuple[int, str]]]] = {}
    for label_value, run_id, profile, status in rows:
        by_release.setdefault(label_value, {}).setdefault(profile, []).append((run_id, status))
    listings = []
    for release in newest:
        outcomes: dict[str, Outcome] = {}
        reasons: dict[str, str] = {}
        pending: dict[str, int] = {}
        for profile, runs in by_release.get(release.value, {}).items():
            decided = next(((i, s) for i, s in reversed(runs) if s in DECIDED), None)
            going = next((i for i, s in reversed(runs) if s in PENDING and (decided is None or i > decided[0])), None)
            outcomes[profile] = _outcome(decided[1] if decided else None, going is not None)
            if decided is not None:
                reasons[profile] = f"{'errored' if decided[1] == 'error' else 'failed'} (run #{decided[0]})"
            if going is not None:
                pending[profile] = going
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
    """The profile's latest mutation batch summed up; the gate's own score, not the release's."""
    matrix = latest_matrix(session, profile)
    if matrix.batch is None:
        return None
    return MutationScore(
        batch=matrix.batch, caught=matrix.caught, judged=matrix.judged, mutants=len(matrix.rows),
        link=f"{base_url}/profiles/{quote(profile)}#mutants",
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
            explanation=r.explanation,
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


def _reasons(run: Run, metrics: Sequence[MetricOutcome]) -> list[str]:
    """Why a failed or errored run did: its failing metrics (the arm named where it had several), or its error."""
    if run.status == "error":
        first = (run.error or "no error recorded").strip().splitlines()[0][:300]
        return [f"errored (run #{run.id}): {first}"]
    if run.status != "failed":  # a passed A/B run's control arm may fail as the run expected
        return []
    arms = {m.arm for m in metrics}
    reasons = []
    for m in metrics:
        if m.verdict == "fail":
            arm = f" [{m.arm}]" if len(arms) > 1 else ""
            line = f" (pass line {format_number(m.threshold)})" if m.threshold is not None else ""
            reasons.append(f"{m.suite}.{m.metric}{arm} {format_number(m.value)}{line}")
    return [f"failed (run #{run.id}): {', '.join(reasons) or run.verdict_summary}"]


def _paired(diff_arm: str, suites: Sequence[SuiteDiff]) -> list[PairedChange]:
    """Counts from the run diff, as each kind summarises its section (`MetricKind.changes`)."""
    return [
        PairedChange(
            arm=diff_arm,
            suite=suite.suite,
            kind=name,
            metric=c.metric,
            matched=c.matched,
            worse=c.worse,
            better=c.better,
            summary=c.summary,
        )
        for suite in suites
        for name in suite.kinds
        for c in kinds.get(name).changes(getattr(suite, name))
    ]


def _compare(
    session: Session, prev: Run, cur: Run, prev_results: Sequence[SuiteResult], cur_results: Sequence[SuiteResult],
    base_url: str,
) -> Comparison:  # fmt: skip
    before = {(r.arm, r.suite, r.metric): r for r in prev_results}
    changes = []
    for r in cur_results:
        old = before.get((r.arm, r.suite, r.metric))
        if old is not None:
            delta = r.value - old.value
            changes.append(
                MetricChange(
                    arm=r.arm, suite=r.suite, metric=r.metric, direction=r.direction, previous=old.value,
                    current=r.value, delta=delta, worse=delta < 0 if r.direction == "higher" else delta > 0,
                )
            )  # fmt: skip
    stored_prev, stored_cur = arms_and_suites(session, prev.id), arms_and_suites(session, cur.id)
    several = len(stored_prev) > 1 or len(stored_cur) > 1
    arms: list[str | None] = [*sorted(set(stored_prev) & set(stored_cur))] or [None]
    paired: list[PairedChange] = []
    links: dict[str, str] = {}
    problems = []
    for arm in arms:
        try:
            diff = diff_runs(session, prev, cur, arm_a=arm, arm_b=arm, top=1)
        except CompareError as exc:
            problems.append(str(exc))
            continue
        name = diff.b.arm if arm is None else arm
        paired.extend(_paired(name, diff.suites))
        query = f"?arm_a={quote(diff.a.arm, safe='')}&arm_b={quote(diff.b.arm, safe='')}" if several else ""
        links[name] = f"{base_url}/compare/{prev.id}/{cur.id}{query}"
    return Comparison(
        previous_run_id=prev.id, metrics=changes, paired=paired, diff_links=links, problem="; ".join(problems)
    )


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
    profiles: dict[str, Profile],
    previous: str | None = None,
    base_url: str = "",
) -> ReleaseSummary:
    """Every profile with runs labelled key=value (and every required one), judged and paired with the
    previous release. ReleaseNotFound when no run has the key, the value, or the named previous value."""
    hint = "a key such as vllm_version or git_sha (see KVCANARY_RELEASE_LABEL)"
    _check_key(session, key, hint)
    runs = _release_runs(session, key, value)
    if not runs:
        recent = ", ".join(r.value for r in releases_of(session, key)[:5])
        raise ReleaseNotFound(f"no run is labelled {key}={value}; recent values of {key}: {recent}")
    named = previous is not None
    previous = previous if named else previous_release(session, key, value)
    prev_runs = _release_runs(session, key, previous) if previous is not None else []
    if named and not prev_runs:
        raise ReleaseNotFound(f"no run is labelled {key}={previous} (the release to compare with)")
    by_profile: dict[str, list[Run]] = {}
    for run in runs:
        by_profile.setdefault(run.profile, []).append(run)
    prev_by_profile: dict[str, list[Run]] = {}
    for run in prev_runs:
        prev_by_profile.setdefault(run.profile, []).append(run)
    latest = {p: _latest(rs) for p, rs in by_profile.items()}
    prev_latest = {p: _latest(rs)[0] for p, rs in prev_by_profile.items()}
    chosen = [r.id for r, _ in latest.values() if r is not None] + [r.id for r in prev_latest.values() if r]
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
        decided, going = latest.get(name, (None, None))
        outcome = _outcome(decided.status if decided else None, going is not None)
        outcomes[name] = outcome
        if going is not None:
            pending[name] = going.id
        metrics, why, comparison, note = [], [], None, ""
        if decided is not None:
            metrics = _metrics(decided, results.get(decided.id, []), profiles.get(name))
            why = _reasons(decided, metrics)
            if why and outcome in ("failed", "error"):
                reasons[name] = why[0]
            before = prev_latest.get(name)
            if previous is None:
                note = f"no earlier release of {key}"
            elif before is None:
                note = f"no decided run of {name} in {key}={previous}"
            else:
                comparison = _compare(
                    session, before, decided, results.get(before.id, []), results.get(decided.id, []), base_url
                )
        rows.append(
            ProfileRelease(
                profile=name, required=name in required, outcome=outcome, runs=len(by_profile.get(name, [])),
                run=ReleaseRun.model_validate(decided, from_attributes=True) if decided is not None else None,
                pending_run_id=going.id if going is not None else None, metrics=metrics, reasons=why,
                comparison=comparison, previous_note=note, mutation=_mutation_score(session, name, base_url),
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
