"""The kill rate of the generated mutants (kernels/generated_mutants.json) on served fixtures.

    python scripts/gpu/kill_rate.py --url URL [--token T] --half held-out \\
        [--fixture triton-attn-llama,triton-mla-480] [--limit N] [--out OUT]

For each fixture, the half's mutants that the fixture reaches at kernel level (the manifest's
evidence differs from fixed on a probe shape of the fixture's path) are queued as one mutation
batch (``kvcanary mutants``: fixed and each mutant as the arms of one run, through the
service's queue), and the matrix is read back with each arm's metrics. Printed, per fixture:
the kill rate per suite and over all suites (caught, or the engine died), and each survivor
with what it changes and its largest effect (each judged metric's value beside fixed's).
A survivor whose every number equals fixed's was not reached by the served model: counted
apart, as the rate's denominator is what the fixture reaches. ``--limit N`` draws N of them
with a seed of the fixture's and the half's names (a sample, for the slow CPU tier). The GPU
gate runs it as its ``generated`` group (``gate_e2e.py``); the CPU tier (``cpu-triton``) runs
it against a local ``kvcanary serve``.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kernels.generated_mutants import HALVES, Generated, kept
from service.runs import mutation_batch
from service.runs.mutation import CONTROL, SEEN, MutationMatrix, new_batch_id


@dataclass(frozen=True)
class Fixture:
    name: str
    profile: str
    shapes: tuple[str, ...]  # the probe shapes (kernels.mutant_probes) on its served path


FIXTURES = (
    Fixture("triton-attn-llama", "mutants-tiny-gpu", ("prefill_b16", "chunk_b16", "decode_b16")),
    Fixture("triton-mla-480", "mutants-tiny-mla-gpu", ("mla_p480",)),
    Fixture("cpu-triton", "drift-tiny-cpu-triton", ("prefill_b16", "chunk_b16", "decode_b16")),
)
FIXTURE_NAMES = {f.name: f for f in FIXTURES}


def reached(fixture: Fixture, half: str) -> list[Generated]:
    """The half's mutants that differ from fixed on a shape of the fixture's path, in manifest order."""
    return [
        m
        for m in kept().values()
        if m.half == half and any(m.evidence.get(shape, 0.0) != 0.0 for shape in fixture.shapes)
    ]


def _values(metrics: Sequence[Mapping[str, Any]], arm: str) -> dict[str, Mapping[str, Any]]:
    return {f"{m['suite']}.{m['metric']}": m for m in metrics if m["arm"] == arm}


def effect(metrics: Sequence[Mapping[str, Any]], arm: str) -> tuple[str, bool]:
    """(each metric of the arm beside fixed's, whether any number differs from fixed's)."""
    mine, control = _values(metrics, arm), _values(metrics, CONTROL)
    parts, moved = [], False
    for key, metric in sorted(mine.items()):
        details = metric.get("details") or {}
        reference = control.get(key, {}).get("value")
        text = f"{key} {metric['value']:.4g}" + (f" (fixed {reference:.4g})" if reference is not None else "")
        moved |= reference is None or metric["value"] != reference
        excess = details.get("dlogprob_excess")
        if excess is not None:
            text += f", decode |Δ logprob| over the floor {excess:.3g}"
            moved |= excess > 0
        if details.get("diverge_earlier"):
            text += f", {details['diverge_earlier']} prompts diverge earlier than the floor"
            moved = True
        parts.append(f"{text} [{metric['verdict']}]")
    return "; ".join(parts) or "no judged metric", moved


def report(fixture: Fixture, half: str, matrix: MutationMatrix, runs: Mapping[int, Mapping[str, Any]]) -> str:
    """The kill rate per suite and overall, and the survivors, in Markdown."""
    made = kept()
    rows = [row for row in matrix.rows if row.mutant in made]
    survivors: list[tuple[str, str]] = []
    unreached: list[tuple[str, str]] = []
    killed = 0
    per_suite = dict.fromkeys(matrix.suites, 0)
    for row in rows:
        seen = [suite for suite, cell in row.cells.items() if cell.state in SEEN]
        for suite in seen:
            per_suite[suite] += 1
        if seen:
            killed += 1
            continue
        text, moved = effect(runs.get(row.run_id or -1, {}).get("metrics", []), row.mutant)
        (survivors if moved else unreached).append((row.mutant, text))
    served = len(rows) - len(unreached)
    lines = [
        f"### {fixture.name} ({fixture.profile}), {half} half: {len(rows)} mutants reached at kernel level",
        "",
        "| suite | killed | of | rate |",
        "|---|---|---|---|",
    ]
    for suite, count in per_suite.items():
        lines.append(f"| {suite} | {count} | {served} | {f'{count / served:.0%}' if served else '-'} |")
    rate = f"{killed / served:.0%}" if served else "-"
    lines.append(f"| **any suite** | **{killed}** | **{served}** | **{rate}** |")
    lines.append("")
    lines.append(
        f"{len(unreached)} computed fixed's numbers when served (every metric equal to fixed's: the served model "
        "never ran the mutated code), not counted."
    )
    for title, listed in (("Survivors", survivors), ("Not reached when served", unreached)):
        if listed:
            lines += ["", f"{title}:", ""]
            lines += [f"- `{name}`: {made[name].summary}. Largest effect: {text}" for name, text in listed]
    return "\n".join(lines)


def measure(
    client: httpx.Client, fixture: Fixture, half: str, limit: int | None, timeout_s: float, poll_s: float
) -> str:
    chosen = [m.id for m in reached(fixture, half)]
    if limit is not None and limit < len(chosen):
        drawn = set(random.Random(f"{fixture.name}:{half}").sample(chosen, limit))
        chosen = [name for name in chosen if name in drawn]
    if not chosen:
        return f"### {fixture.name}, {half} half: no mutant of the half reaches this fixture at kernel level"
    print(f"== {fixture.name}: {len(chosen)} mutants of the {half} half on {fixture.profile}", file=sys.stderr)
    batch = new_batch_id()
    [matrix] = mutation_batch.run_remote(client, [fixture.profile], chosen, batch, {"half": half}, timeout_s, poll_s)
    runs = {
        row.run_id: client.get(f"/api/v1/runs/{row.run_id}").raise_for_status().json()
        for row in matrix.rows
        if row.run_id is not None
    }
    return report(fixture, half, matrix, runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="a kvcanary service (kvcanary serve) whose worker runs the batch")
    parser.add_argument("--token", default=None, help="API token (admin role: batches are records an admin starts)")
    parser.add_argument("--half", choices=HALVES, default="held-out")
    parser.add_argument(
        "--fixture", default="triton-attn-llama,triton-mla-480", help=f"comma list of {', '.join(FIXTURE_NAMES)}"
    )
    parser.add_argument("--limit", type=int, default=None, help="a sample of N reached mutants a fixture (seeded)")
    parser.add_argument("--timeout", type=float, default=12 * 3600)
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    printed = []
    with httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=60) as client:
        for name in args.fixture.split(","):
            printed.append(measure(client, FIXTURE_NAMES[name], args.half, args.limit, args.timeout, 5.0))
    text = "\n\n".join(printed)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
