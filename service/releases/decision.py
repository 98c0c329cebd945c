"""Which run decides a profile's row in a release, and what the row then says.

Only gate-grade runs decide (`service.runs.gate_grade`): the newest of them that passed, failed or
errored. A failed one keeps the profile blocked until a later gate-grade run passes, and the row
then says both ("failed #12, passed on re-run #15"). A pass whose verdict is `inconclusive` is
its own outcome: it never counts as passed for a required profile. Runs that may not decide are
listed as exploratory, whatever they did. The release index and the release page both call
`decide`, so the list and the page never disagree.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from service.releases.schemas import NOT_RUN, ExploratoryRun, Outcome
from service.runs.gate_grade import why_exploratory
from service.runs.state import Status

DECIDED = frozenset({Status.PASSED.value, Status.FAILED.value, Status.ERROR.value})
PENDING = frozenset(
    {Status.QUEUED.value, Status.STARTING_ENGINE.value, Status.RUNNING.value, Status.SCORING.value}
    | {Status.INTERRUPTED.value}
)
FAILED_WORD = {Status.FAILED.value: "failed", Status.ERROR.value: "errored"}


@dataclass(frozen=True)
class RunFacts:
    """What deciding needs of a run."""

    id: int
    status: str
    verdict: str | None
    exploratory: str
    role: str


@dataclass(frozen=True)
class Decision:
    decided: int | None  # the deciding run
    outcome: Outcome
    pending: int | None  # a newer gate-grade run still queued or going
    history: str = ""
    exploratory: list[ExploratoryRun] = field(default_factory=list)

    def after(self) -> str:
        """For a failed row's reason: the newer exploratory runs that do not lift it."""
        newer = [run for run in self.exploratory if self.decided is not None and run.id > self.decided]
        return "".join(f"; run #{run.id} ({run.status}) does not decide: {run.why}" for run in reversed(newer))


def _outcome(run: RunFacts) -> Outcome:
    if run.status == Status.PASSED.value:
        return "inconclusive" if run.verdict == "inconclusive" else "passed"
    return "failed" if run.status == Status.FAILED.value else "error"


def decide(runs: Sequence[RunFacts], gate_roles: Collection[str]) -> Decision:
    """The row of one profile from its runs in the release (in id order)."""
    gate: list[RunFacts] = []
    exploratory: list[ExploratoryRun] = []
    for run in runs:
        why = why_exploratory(run.exploratory, run.role, gate_roles)
        if why:
            exploratory.append(ExploratoryRun(id=run.id, status=run.status, verdict=run.verdict, why=why))
        else:
            gate.append(run)
    exploratory.reverse()
    decided = [run for run in gate if run.status in DECIDED]
    last = decided[-1] if decided else None
    pending = next((r.id for r in reversed(gate) if r.status in PENDING and (last is None or r.id > last.id)), None)
    if last is None:
        return Decision(None, "running" if pending is not None else NOT_RUN, pending, "", exploratory)
    history = ""
    before = decided[-2] if len(decided) > 1 else None
    if last.status == Status.PASSED.value and before is not None and before.status in FAILED_WORD:
        history = f"{FAILED_WORD[before.status]} #{before.id}, passed on re-run #{last.id}"
    return Decision(last.id, _outcome(last), pending, history, exploratory)
