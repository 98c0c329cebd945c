"""The gate's `share` group: each GPU mutation matrix run twice, a fresh engine per arm and then on
shared engines, side by side in one session (`scripts/gpu/gate_e2e.py --rows share`).

Each run is the mutation batch's run (`fixed`, every catalogued mutant, with the canaries the
mutants need) plus `fixed` again as its last arm (`fixed,enforce_eager=true`: the profiles are
eager already, so the engine's arguments stay those of `fixed`). Printed: the two wall times and
their ratio (target: shared at most 40% of fresh), the engines each mode started, every arm whose
verdicts differ between the modes (there must be none), the A/A of `fixed` against `fixed` again
in each mode (prompts whose drift outputs are the same bit for bit; fresh engines measure the
engine-to-engine difference, the shared engine the difference across switches), and the
prefix-cache probe of every switch (tokens hit before the reset and after it: after must be 0).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from kernels.mutants import MUTANTS
from service.db.session import session_scope
from service.runs import store
from service.runs.mutation import BATCH_LABEL, run_request
from service.runs.shared_engines import same_outputs
from service.settings import PACKAGED_PROFILES

# GATE_SHARE_PROFILES=a,b runs fewer (a GPU host with little time left: the MLA matrix first)
PROFILES = tuple(
    p for p in os.environ.get("GATE_SHARE_PROFILES", "mutants-tiny-mla-gpu,mutants-tiny-gpu").split(",") if p
)
FIXED_AGAIN = "fixed,enforce_eager=true"
# GATE_SHARE_MODES=shared runs one mode (a host with little time: no ratio, the probes and the A/A only)
MODES = tuple(m for m in os.environ.get("GATE_SHARE_MODES", "fresh,shared").split(",") if m)
TARGET = 0.40
FINAL = {"passed", "failed", "error", "cancelled"}


def request(profile: str, mode: str) -> dict[str, Any]:
    """The POST body: the mutation batch's run of `profile` (labelled `gate: share-<mode>` instead of
    a batch), `fixed` again last, `arm_engines: mode`."""
    spec = yaml.safe_load((PACKAGED_PROFILES / f"{profile}.yaml").read_text())
    canaries = (spec.get("kernels") or {}).get("canaries") or []
    body = run_request(profile, canaries, list(MUTANTS), "", {"gate": f"share-{mode}"})
    del body["labels"][BATCH_LABEL]  # not a mutation batch: `kvcanary mutants --show` keeps the matrix's own
    body["compare"] = [*body["compare"], FIXED_AGAIN]
    body["expect"] = {**body["expect"], FIXED_AGAIN: "pass"}
    body["overrides"] = {**body.get("overrides", {}), "arm_engines": mode}
    return body


def verdicts(run: Mapping[str, Any]) -> dict[str, list[tuple[str, str, str | None]]]:
    """Per arm (its engine's death included), each metric's (suite, metric, verdict)."""
    found: dict[str, list[tuple[str, str, str | None]]] = {arm: [] for arm in run["variants"]}
    for m in run["metrics"]:
        found.setdefault(m["arm"], []).append((m["suite"], m["metric"], m["verdict"]))
    arm_verdicts = run.get("arm_verdicts") or {}
    return {arm: [*sorted(rows), ("arm", "verdict", arm_verdicts.get(arm))] for arm, rows in found.items()}


def disagreements(fresh: Mapping[str, Any], shared: Mapping[str, Any]) -> list[str]:
    """Arms whose verdicts differ between the two modes."""
    a, b = verdicts(fresh), verdicts(shared)
    return [
        f"{arm}: fresh {a.get(arm)} / shared {b.get(arm)}"
        for arm in sorted(a.keys() | b.keys())
        if a.get(arm) != b.get(arm)
    ]


def timings(run: Mapping[str, Any]) -> tuple[int, float, int, float]:
    """(engine starts, their seconds, switches, their seconds) from the run's timings."""
    starts = [v for k, v in run["timings"].items() if k.endswith(".engine_start_s")]
    switches = [v for k, v in run["timings"].items() if k.endswith(".engine_switch_s")]
    return len(starts), sum(starts), len(switches), sum(switches)


def probes(run: Mapping[str, Any]) -> list[str]:
    """One line per switch: its generation and the prefix-cache probe's hits before and after the reset."""
    lines = []
    for arm in run["variants"]:
        switch = ((run["engine"].get(arm) or {}).get("engine_use") or {}).get("switch")
        if switch:
            cache = switch["prefix_cache"]
            lines.append(
                f"switch {switch['generation']} to {arm}: {cache['hits_before_reset']:g} tokens hit before the reset, "
                f"{cache['hits_after_reset']:g} after"
            )
    return lines


def problems(fresh: Mapping[str, Any], shared: Mapping[str, Any]) -> list[str]:
    """What the share rows must show: the same verdicts, a probe that hit before every reset and
    never after, and the sharing itself (fewer engines than arms)."""
    found = [f"verdicts differ: {line}" for line in disagreements(fresh, shared)]
    for arm in shared["variants"]:
        switch = ((shared["engine"].get(arm) or {}).get("engine_use") or {}).get("switch")
        if switch and switch["prefix_cache"]["hits_after_reset"] != 0:
            found.append(f"{arm}: the prefix cache hit after the reset")
    if len(shared["engine_groups"]) >= len(shared["variants"]):
        found.append(f"shared mode started {len(shared['engine_groups'])} engines for {len(shared['variants'])} arms")
    return found


def _aa(database: Path, run_id: int) -> str:
    with session_scope(f"sqlite:///{database}", write=False) as session:
        first, again = (
            {key: s.data["arm"] for key, s in store.load_samples(session, run_id, arm, "drift").items()}
            for arm in ("fixed", FIXED_AGAIN)
        )
    aa = same_outputs(first, again)
    return (
        f"{aa['identical']} of {aa['prompts']} prompts bit-identical, largest logprob difference "
        f"{aa['max_abs_logprob_diff']:.3g}"
    )


def _submit(client: httpx.Client, body: dict[str, Any], poll_s: float) -> tuple[dict[str, Any], float]:
    began = time.monotonic()
    created = client.post("/api/v1/runs", json=body, headers={"Idempotency-Key": f"gate-share-{time.time_ns()}"})
    created.raise_for_status()
    run_id = created.json()["id"]
    while True:
        run: dict[str, Any] = client.get(f"/api/v1/runs/{run_id}").raise_for_status().json()
        if run["status"] in FINAL:
            return run, time.monotonic() - began
        time.sleep(poll_s)


def shared_vs_fresh(
    url: str, token: str, database: Path, profiles: Sequence[str] = PROFILES, poll_s: float = 5.0
) -> tuple[str, list[str]]:
    """Each profile's matrix run fresh, then shared; the printed comparison and its problems."""
    lines = [
        "| profile | mode | run | status | wall | engines (start s) | switches (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    found: list[str] = []
    details: list[str] = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        for profile in profiles:
            runs: dict[str, dict[str, Any]] = {}
            for mode in MODES:
                print(f"== share {profile} {mode}", flush=True)
                run, seconds = _submit(client, request(profile, mode), poll_s)
                runs[mode] = run
                starts, start_s, switches, switch_s = timings(run)
                lines.append(
                    f"| {profile} | {mode} | {run['id']} | {run['status']} | {seconds / 60:.1f} min | "
                    f"{starts} ({start_s:.0f} s) | {switches} ({switch_s:.0f} s) |"
                )
                runs[mode]["wall_s"] = seconds
            if "fresh" in runs and "shared" in runs:
                ratio = runs["shared"]["wall_s"] / runs["fresh"]["wall_s"]
                details.append(
                    f"\n{profile}: shared / fresh = {ratio:.2f} (target <= {TARGET:.2f}: "
                    f"{'met' if ratio <= TARGET else 'NOT met'}); engines shared: {runs['shared']['engine_groups']}"
                )
            for mode in runs:
                details.append(f"  A/A fixed vs {FIXED_AGAIN} ({mode}): {_aa(database, runs[mode]['id'])}")
            if "shared" in runs:
                details += [f"  {line}" for line in probes(runs["shared"])]
            if "fresh" in runs and "shared" in runs:
                same = disagreements(runs["fresh"], runs["shared"])
                details.append(f"  verdicts: {'the same for every arm' if not same else '; '.join(same)}")
                found += [f"{profile}: {p}" for p in problems(runs["fresh"], runs["shared"])]
    return "\n".join(lines + details), found
