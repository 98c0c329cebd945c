"""Benchmark: one ci token floods the queue with 10-arm runs of the 48B profile; how much is
queued, what the flood is told, and how long another team's next run waits behind it.

Against a real `kvcanary serve` (worker off, SQLite): the flooding token sends `--runs` triggers
(default 500) of `kimi-linear-48b-a3b` with 10 arms each, `--concurrency` at a time; then a
second ci token triggers one run. The queue is then drained as workers would drain it
(`service.runs.queue.claim_next`, the claim every executor makes), and the second token's run's
place in that order is reported.

Prints: the flood's answers by status, the runs and engine loads (arms x runs) it got queued,
one refusal's message and Retry-After, and how many runs start before the other token's run.
Targets: the flood holds no more than its token's quotas; the other token's run is among the
first two to start.

    .venv/bin/python scripts/bench_flood.py [--runs 500] [--concurrency 20]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_burst import serve  # noqa: E402

from service.auth import Role, create_token  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402
from service.db.session import session_scope  # noqa: E402
from service.runs.queue import claim_next  # noqa: E402

PROFILE = "kimi-linear-48b-a3b"
ARMS = ["fixed", "stock", *(f"fixed,max_num_batched_tokens={1024 * k}" for k in range(1, 9))]


async def flood(url: str, token: str, runs: int, concurrency: int) -> tuple[Counter[int], list[httpx.Response]]:
    statuses: Counter[int] = Counter()
    refusals: list[httpx.Response] = []
    gate = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:

        async def one(n: int) -> None:
            async with gate:
                answer = await client.post(
                    "/api/v1/runs", json={"profile": PROFILE, "compare": ARMS, "labels": {"flood": str(n)}}
                )
            statuses[answer.status_code] += 1
            if answer.status_code >= 400 and len(refusals) < 1:
                refusals.append(answer)

        await asyncio.gather(*(one(n) for n in range(runs)))
    return statuses, refusals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvc-flood-") as tmp:
        folder = Path(tmp)
        url_for_tokens = f"sqlite:///{folder / 'kvcanary.db'}"
        upgrade(url_for_tokens)
        with session_scope(url_for_tokens) as session:
            flooder, other = create_token(session, "flood", Role.CI), create_token(session, "other-team", Role.CI)
        with serve(folder, None) as url:
            began = time.perf_counter()
            statuses, refusals = asyncio.run(flood(url, flooder, args.runs, args.concurrency))
            seconds = time.perf_counter() - began
            theirs = httpx.post(
                f"{url}/api/v1/runs", json={"profile": PROFILE}, headers={"Authorization": f"Bearer {other}"}
            )
            queued = httpx.get(f"{url}/api/v1/runs", params={"status": "queued", "limit": 500}).json()["total"]
        assert theirs.status_code == 201, theirs.text
        their_id = theirs.json()["id"]
        order: list[int] = []
        arms_of: dict[int, int] = {}
        while True:
            with session_scope(url_for_tokens) as session:
                run = claim_next(session, "bench-flood:0")
                if run is None:
                    break
                order.append(run.id)
                arms_of[run.id] = len(run.arms or [])
    flood_runs = [run_id for run_id in order if run_id != their_id]
    print(
        f"flood: {args.runs} triggers of {len(ARMS)} arms in {seconds:.1f} s; answers {dict(sorted(statuses.items()))}"
    )
    print(
        f"  queued for the flooding token: {len(flood_runs)} runs, {sum(arms_of[r] for r in flood_runs)} engine loads"
    )
    for refusal in refusals:
        print(f"  a refusal: {refusal.status_code}, Retry-After {refusal.headers.get('retry-after')!r}: {refusal.text}")
    place = order.index(their_id)
    print(
        f"another token's run (queued last, {queued} queued in all): {place} runs start before it (place {place + 1})"
    )


if __name__ == "__main__":
    main()
