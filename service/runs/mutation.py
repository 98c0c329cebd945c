"""The mutation matrix: which suite catches which kernel mutant, at how many prompts, in how long.

A mutation batch is one run per profile whose first arm is ``fixed`` and whose other arms are
the mutants, on the profile's suites, recorded as a batch (``service.runs.batches``; the run also
carries the label ``mutation_batch=<id>``, which no trigger may set): every mutant arm is
judged against the one ``fixed`` arm, so the control's engine starts once for the whole batch
(an arm whose engine dies does not stop the others). The matrix is computed from the stored
runs alone, once when the batch's run ends, so the API, the CLI and the dashboard render the
same stored document. A cell is ``caught`` when the mutant arm's verdict for that suite is ``fail`` (the
drift suite judges the candidate arm against the control arm's floor; GSM8k by its baseline
and paired McNemar against the control arm), ``died`` when the mutant arm's engine died (a
crash is seen too), ``missed`` when the arm was judged and did not fail, and ``error`` or
``pending`` otherwise. ``turned_at`` is the fewest items (taken in key order, as
``scripts/bench_drift.py`` does) whose paired judgement against the control arm fails: the
drift kind's own judgement, or the paired test with no tolerance rule.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from evals import suites as suite_registry
from evals.verdict import _SEVERITY, judge_ab
from kernels import mutants as catalogue
from kernels.mutants import MUTANTS
from service.db.models import Run, SuiteResult
from service.profiles import ArmSpec, Profile, RunOverrides
from service.runs import queue, store
from service.runs.admission import admit
from service.runs.state import FINAL

BATCH_LABEL = "mutation_batch"
CONTROL = "fixed"
CellState = Literal["caught", "died", "missed", "error", "pending"]
SEEN: tuple[CellState, ...] = ("caught", "died")


class MatrixCell(BaseModel):
    suite: str
    state: CellState
    verdict: str | None = Field(None, description="The mutant arm's worst verdict over the suite's metrics")
    turned_at: int | None = Field(None, description="Fewest items whose paired judgement fails; null: not within")
    items: int = Field(0, description="Items both arms ran")
    unit: str = Field("items", description="What an item is: prompts, items, utterances")
    seconds: float | None = Field(None, description="The mutant arm's time on this suite")


class MatrixRow(BaseModel):
    mutant: str
    run_id: int | None
    status: str
    cells: dict[str, MatrixCell]
    condition: str
    served: str


class MutationMatrix(BaseModel):
    """The latest mutation batch of one profile: mutant x suite."""

    profile: str
    batch: str | None
    started_by: str | None = Field(None, description="Who started the batch (`kvcanary mutants`)")
    started_role: str | None = Field(None, description="admin, host (the CLI on the service's host) or scheduler")
    started_at: datetime | None = None
    settled_at: datetime | None = Field(None, description="When the matrix was computed: its run's end; null: not yet")
    suites: list[str]
    rows: list[MatrixRow]
    caught: int = Field(description="Mutants seen (caught or died) by at least one suite")
    judged: int = Field(description="Mutants whose run finished")


def new_batch_id() -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}"


def run_request(
    profile: str, profile_canaries: Sequence[str], mutants: Sequence[str], batch: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """The run a batch queues, as the API's POST body: fixed, then each mutant, with the canaries
    that make the mutants' conditions reachable added to the profile's (fixed must pass them all).
    A mutant named twice is one arm."""
    mutants = list(dict.fromkeys(mutants))
    needed = [canary for mutant in mutants for canary in catalogue.canaries(mutant)]
    canaries = list(dict.fromkeys([*profile_canaries, *needed]))
    body: dict[str, Any] = {
        "profile": profile,
        "labels": {**labels, BATCH_LABEL: batch},
        "compare": [CONTROL, *mutants],
        "expect": {CONTROL: "pass", **{mutant: "fail" for mutant in mutants}},
    }
    if canaries != list(profile_canaries):
        body["overrides"] = {"canaries": canaries}
    return body


def enqueue_batch(
    session: Session, profile: Profile, mutants: Sequence[str], batch: str, labels: Mapping[str, str], by: str
) -> int:
    """Queue the batch's run on this database's queue; returns its id. Whether this host can
    run the profile is the caller's to check, once for the batch (`admission.fitted`)."""
    body = run_request(profile.name, profile.kernels.canaries, mutants, batch, labels)
    overrides = RunOverrides.model_validate(body.get("overrides", {}))
    arms = [ArmSpec(variant=arm) for arm in body["compare"]]
    admitted = admit(profile, overrides, arms, body["expect"], on_this_host=False)
    run, _ = queue.enqueue(
        session,
        profile=profile.name,
        trigger="manual",
        triggered_by=by,
        labels=body["labels"],
        overrides=overrides.model_dump(exclude_none=True),
        arms=admitted.plan.stored_arms(),
        expect=admitted.plan.expect,
        max_attempts=profile.max_attempts,
        profile_snapshot=admitted.snapshot(),
    )
    session.flush()
    return run.id


def _turned_at(session: Session, run: Run, mutant: str, suite: str, metrics: Sequence[str]) -> tuple[int | None, int]:
    """(fewest items whose paired judgement fails over any metric, items both arms ran)."""
    compares = suite_registry.get(suite).compares_outputs
    treatment = store.load_samples(session, run.id, mutant, suite)
    control = store.load_samples(session, run.id, CONTROL, suite)
    fewest: int | None = None
    shared = 0
    for metric in metrics:
        kind = suite_registry.metric_kind(suite, metric)
        scores = kind.scores(treatment, metric)
        reference = kind.scores(control, metric)
        keys = sorted(scores if compares else scores.keys() & reference.keys())
        shared = max(shared, len(keys))
        for n in range(1, len(keys) + 1):
            subset = {key: scores[key] for key in keys[:n]}
            if compares:
                verdict = kind.judge(suite, metric, subset, None).verdict
            else:
                verdict = judge_ab(suite, metric, kind.judge, reference, subset, control_label=CONTROL).verdict
            if verdict == "fail":
                fewest = n if fewest is None else min(fewest, n)
                break
    return fewest, shared


def _cells(
    session: Session, run: Run, mutant: str, suites: Sequence[str], turning_points: bool
) -> dict[str, MatrixCell]:
    results = session.scalars(select(SuiteResult).where(SuiteResult.run_id == run.id, SuiteResult.arm == mutant)).all()
    timings = run.timings or {}
    finished = run.status in {s.value for s in FINAL}
    died = f"arm {mutant!r} died" in (run.error or "")
    cells = {}
    for suite in suites:
        judged = [r for r in results if r.suite == suite and r.verdict is not None]
        unit = suite_registry.metric_kind(suite, judged[0].metric).items if judged else "items"
        seconds = timings.get(f"{mutant}.{suite}_s")
        if judged:
            worst = max((str(r.verdict) for r in judged), key=lambda v: _SEVERITY.get(v, 0))  # as run_verdict ranks
            if turning_points:
                turned, items = _turned_at(session, run, mutant, suite, [r.metric for r in judged])
            else:  # the run has not ended: no prefix search yet, the items its results counted
                turned, items = None, max(r.n for r in judged)
            state: CellState = "caught" if worst == "fail" else "missed"
            cells[suite] = MatrixCell(
                suite=suite, state=state, verdict=worst, turned_at=turned, items=items, unit=unit, seconds=seconds
            )
        else:
            state = "pending" if not finished else "died" if died else "error"
            cells[suite] = MatrixCell(suite=suite, state=state, seconds=seconds)
    return cells


def compute_matrix(
    session: Session,
    profile: str,
    batch: str,
    run_id: int | None,
    suites: Sequence[str] = (),
    turning_points: bool = True,
) -> MutationMatrix:
    """The matrix of one batch's run (empty rows where it is gone). ``turning_points``: search each
    caught cell's fewest items (quadratic in the items: done once, when the run ends).

    ``suites`` orders the columns (the profile's suites); suites seen only in stored results
    are added after them.
    """
    runs: dict[str, Run] = {}
    run = session.get(Run, run_id) if run_id is not None else None
    if run is not None:
        for arm in run.arms or []:
            if arm["variant"] != CONTROL and not arm.get("engine"):
                runs[arm["variant"]] = run
    columns = list(suites)
    if runs:
        stored = session.scalars(
            select(SuiteResult.suite).where(SuiteResult.run_id.in_([r.id for r in runs.values()])).distinct()
        )
        columns += sorted(set(stored) - set(columns))
    rows = []
    for name in [*MUTANTS, *sorted(set(runs) - set(MUTANTS))]:
        if name not in runs:
            continue
        run = runs[name]
        condition, served = catalogue.described(name)
        rows.append(
            MatrixRow(
                mutant=name,
                run_id=run.id,
                status=run.status,
                cells=_cells(session, run, name, columns, turning_points),
                condition=condition,
                served=served,
            )
        )
    finals = {s.value for s in FINAL}
    return MutationMatrix(
        profile=profile,
        batch=batch,
        suites=columns,
        rows=rows,
        caught=sum(1 for row in rows if any(c.state in SEEN for c in row.cells.values())),
        judged=sum(1 for row in rows if row.status in finals),
    )


def _cell_text(cell: MatrixCell | None) -> str:
    if cell is None:
        return "-"
    seconds = f", {cell.seconds:.0f} s" if cell.seconds is not None else ""
    if cell.state == "caught":
        turned = f"at {cell.turned_at}" if cell.turned_at else "not on a prefix"
        return f"caught ({turned} of {cell.items} {cell.unit}{seconds})"
    if cell.state == "missed":
        return f"missed ({cell.verdict}, {cell.items} {cell.unit}{seconds})"
    return cell.state


def _origin(matrix: MutationMatrix) -> str:
    if matrix.started_at is None:
        return ""
    return f" (started by {matrix.started_by} ({matrix.started_role}) at {matrix.started_at:%Y-%m-%d %H:%M} UTC)"


def markdown(matrices: Sequence[MutationMatrix]) -> str:
    """One Markdown table, mutant x (profile, suite), as docs/mutants.md quotes it."""
    columns = [(m, suite) for m in matrices for suite in m.suites]
    names = list(dict.fromkeys(row.mutant for m in matrices for row in m.rows))
    header = "| mutant | " + " | ".join(f"{m.profile}: {suite}" for m, suite in columns) + " |"
    lines = [header, "|---" * (len(columns) + 1) + "|"] if any(m.rows for m in matrices) else []
    for name in names:
        cells = []
        for matrix, suite in columns:
            row = next((r for r in matrix.rows if r.mutant == name), None)
            cells.append(_cell_text(row.cells.get(suite) if row else None))
            if row is not None and suite == matrix.suites[0]:
                cells[-1] = f"{cells[-1]} [run {row.run_id}]"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for matrix in matrices:
        if matrix.batch is None:
            lines.append(
                f"\n{matrix.profile}: no mutation batch stored yet (`kvcanary mutants {matrix.profile}` runs one)"
            )
            continue
        lines.append(
            f"\n{matrix.profile}: batch {matrix.batch}{_origin(matrix)}, {matrix.caught} of {len(matrix.rows)} "
            f"mutants seen by at least one suite; {matrix.judged} of {len(matrix.rows)} judged (their run ended)"
        )
    return "\n".join(lines).lstrip("\n")
