"""`kvcanary mutants`: queue one run per profile, fixed then every mutant, through the queue, here
or on a service, then read the matrix back (``service.runs.mutation``).

Here: the runs go onto this host's queue (the configured database) and run one after another
in this process, as `kvcanary run` does. With a URL: they are POSTed to the service's queue
(each with an Idempotency-Key of its batch and profile, so a resent POST queues nothing twice),
polled until they end, and the matrix is the service's `GET /api/v1/profiles/{name}/mutants`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence

import httpx

from service.profiles import Profile
from service.runs.batches import latest_matrix, start_batch
from service.runs.gate_grade import HOST
from service.runs.mutation import MutationMatrix
from service.settings import Settings

FINAL_STATUSES = ("passed", "failed", "error", "cancelled")


def run_here(
    settings: Settings,
    profiles: Mapping[str, Profile],
    selected: Sequence[Profile],
    mutants: Sequence[str],
    batch: str,
    labels: Mapping[str, str],
    by: str,
    say: Callable[[str], None],
) -> list[MutationMatrix]:
    """Queue and execute each profile's run on this host, in queue order."""
    from service import baselines
    from service.db.migrate import upgrade
    from service.db.session import session_scope
    from service.runs import pipeline, queue
    from service.runs.worker import new_worker_id

    url = settings.resolved_database_url()
    upgrade(url)
    worker_id = new_worker_id()
    with session_scope(url) as session:
        baselines.seed_from_profiles(session, dict(profiles))
        records = [start_batch(session, profile, mutants, batch, labels, by, HOST) for profile in selected]
        queued = [(record.profile, record.run_id) for record in records if record.run_id is not None]
    against = ", ".join(mutants)
    for name, run_id in queued:
        began = time.monotonic()
        with session_scope(url) as session:
            claimed = queue.claim_next(session, worker_id, run_id)
        if claimed is None:
            say(f"run {run_id} ({name}) was taken by another worker; its result is read when it ends")
            continue
        status = pipeline.run_claimed(run_id, settings, profiles, worker_id)
        say(f"run {run_id} {name} fixed vs {against}: {status} in {time.monotonic() - began:.0f} s")
    with session_scope(url, write=False) as session:
        return [latest_matrix(session, p.name, [e.suite for e in p.suites]) for p in selected]


def run_remote(
    client: httpx.Client,
    selected: Sequence[str],
    mutants: Sequence[str],
    batch: str,
    labels: Mapping[str, str],
    timeout_s: float,
    poll_s: float,
) -> list[MutationMatrix]:
    """Start the batch on the service (`POST /api/v1/mutation-batches`, an admin token; resent with the
    same batch id it queues nothing twice), wait for its runs, read the matrices."""
    against = ", ".join(mutants)
    body = {"batch": batch, "profiles": list(selected), "mutants": list(mutants), "labels": dict(labels)}
    response = client.post("/api/v1/mutation-batches", json=body)
    if response.status_code >= 400:
        raise RuntimeError(f"starting batch {batch} (fixed vs {against}): {response.status_code} {response.text}")
    ids = []
    for record in response.json():
        ids.append(record["run_id"])
        print(f"run {ids[-1]} queued: {record['profile']} fixed vs {against}", file=sys.stderr)
    deadline = time.monotonic() + timeout_s
    waiting = list(ids)
    while waiting:
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs {waiting} did not end within {timeout_s:g} s")
        time.sleep(poll_s)
        try:
            runs = [client.get(f"/api/v1/runs/{run_id}").raise_for_status().json() for run_id in waiting]
        except httpx.TransportError as exc:  # a restarting service: its runs survive, ask again
            print(f"service not answering ({type(exc).__name__}); asking again", file=sys.stderr)
            continue
        for run in runs:
            if run["status"] in FINAL_STATUSES:
                print(f"run {run['id']}: {run['status']}", file=sys.stderr)
        waiting = [run["id"] for run in runs if run["status"] not in FINAL_STATUSES]
    return [
        MutationMatrix.model_validate(client.get(f"/api/v1/profiles/{name}/mutants").raise_for_status().json())
        for name in selected
    ]
