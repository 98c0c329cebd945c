"""Benchmark: a burst of concurrent triggers against a real `kvcanary serve` (worker off).

Fires N concurrent `POST /api/v1/runs` (default 1,000), each with its own Idempotency-Key and
connection, like a merge train or a matrix build (a lean asyncio client, so that the client is
not what holds replies back). A caller answered 429/503 waits the Retry-After it was
given and tries again, as `kvcanary submit` does. While the burst lasts, /healthz is polled from another process.
Then every key is sent once more: each must return the run it was acknowledged with (200),
and the runs stored must be exactly the runs those retries return.

Prints: status counts, 5xx count, timeouts at 60 s, runs acknowledged vs stored, runs stored
twice, runs stored unacknowledged, when the first reply came and the reply times' p50/p90/p99
(seconds from the burst's start to each trigger's final answer), and /healthz p50/p99 during
the burst. Targets: 0 x 5xx (503 with Retry-After is counted apart), 0 timeouts, every
acknowledged run stored exactly once, the first reply within 1 s (replies come as runs
commit, not when the burst ends), /healthz p99 < 100 ms.

    .venv/bin/python scripts/bench_burst.py [--requests 1000] [--postgres]

--postgres uses KVCANARY_TEST_POSTGRES_URL's server when set (a new database on it), else
starts a throwaway one with scripts/start_postgres.sh. The default is the embedded SQLite file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_postgres_api import free_port, fresh_database, postgres_server  # noqa: E402

from evals.retry_after import retry_after_s  # noqa: E402
from service.auth import Role, create_token  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402
from service.db.session import session_scope  # noqa: E402

PROFILE = "kimi-linear-48b-a3b"
TIMEOUT_S = 60.0
HEALTH_TARGET_P99_MS = 100.0
FIRST_REPLY_TARGET_S = 1.0


# One token on one address stands in for a thousand CI jobs on their own hosts: the per-token
# queue quota and the per-client connection cap are lifted (bench_flood.py and
# bench_slow_clients.py measure those).
ONE_FOR_MANY = {
    "KVCANARY_MAX_QUEUED_RUNS_PER_TOKEN": "100000",
    "KVCANARY_MAX_QUEUED_ENGINE_LOADS_PER_TOKEN": "100000",
    "KVCANARY_MAX_QUEUED_RUNS": "100000",
    "KVCANARY_MAX_CONNECTIONS_PER_CLIENT": "100000",
}


@contextmanager
def serve(data_dir: Path, database_url: str | None, settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """A real `kvcanary serve`, worker off, on a free port, with `settings` (KVCANARY_ variables); its URL."""
    port = free_port()
    env = {**os.environ, "KVCANARY_DATA_DIR": str(data_dir), "KVCANARY_START_WORKER": "false", **(settings or {})}
    if database_url:
        env["KVCANARY_DATABASE_URL"] = database_url
    log = (data_dir / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"kvcanary serve did not come up: {(data_dir / 'serve.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


@dataclass
class Burst:
    statuses: Counter[str] = field(default_factory=Counter)
    acknowledged: dict[str, int] = field(default_factory=dict)  # key -> run id
    timeouts: int = 0
    retried_busy: int = 0
    health_ms: list[float] = field(default_factory=list)
    health_failures: int = 0  # not 200, or no answer within the timeout
    seconds: float = 0.0
    began: float = 0.0  # perf_counter at the burst's start
    reply_s: list[float] = field(default_factory=list)  # per trigger: start of burst -> final answer

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status.startswith("5") and status != "503")


async def _post(url: str, token: str, key: str) -> tuple[int, dict[str, str], bytes]:
    """One trigger on a connection of its own, as one CI job sends it: status, headers, body.

    Plain asyncio streams, not httpx: one httpx pool of 1,000 connections spends more CPU than
    the service (its pool is scanned per request) and would hold replies back itself.
    """
    address = httpx.URL(url)
    reader, writer = await asyncio.open_connection(address.host, address.port)
    try:
        body = json.dumps({"profile": PROFILE, "labels": {"burst": key}}).encode()
        head = (
            f"POST /api/v1/runs HTTP/1.1\r\nHost: {address.host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
        status = int((await reader.readline()).split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))
    finally:
        writer.close()


async def _trigger(url: str, token: str, key: str, burst: Burst) -> None:
    try:
        await _try_until_answered(url, token, key, burst)
    finally:
        burst.reply_s.append(time.perf_counter() - burst.began)


async def _try_until_answered(url: str, token: str, key: str, burst: Burst) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            status, headers, body = await asyncio.wait_for(_post(url, token, key), TIMEOUT_S)
        except TimeoutError:
            burst.timeouts += 1
            burst.statuses["timeout"] += 1
            return
        except (OSError, IndexError, ValueError, asyncio.IncompleteReadError) as exc:
            burst.statuses[type(exc).__name__] += 1
            return
        burst.statuses[str(status)] += 1
        retry_after = retry_after_s(headers.get("retry-after"))
        if status in (429, 503) and retry_after is not None and time.monotonic() < deadline:
            burst.retried_busy += 1
            await asyncio.sleep(retry_after)
            continue
        if status in (200, 201):
            burst.acknowledged[key] = json.loads(body)["id"]
        return


def _watch_health(url: str, go: Event, stop: Event, answers: Connection) -> None:
    """In a process of its own, so neither the burst's client nor its GIL delays the measurement;
    polls from `go` to `stop`, then sends back the milliseconds of each poll and how many failed."""
    timings: list[float] = []
    failures = 0
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
        client.get("/healthz")  # connected before the burst starts
        answers.send("ready")
        go.wait()
        while not stop.is_set():
            began = time.perf_counter()
            try:
                healthy = client.get("/healthz").status_code == 200
            except httpx.HTTPError:
                healthy = False
            timings.append((time.perf_counter() - began) * 1000)
            failures += not healthy
            stop.wait(0.02)
    answers.send((timings, failures))


async def fire(url: str, token: str, keys: list[str]) -> Burst:
    """Every key's trigger at once, with /healthz timed alongside."""
    burst = Burst()
    spawn = multiprocessing.get_context("spawn")
    go, stop, (received, sent) = spawn.Event(), spawn.Event(), spawn.Pipe(duplex=False)
    watcher = spawn.Process(target=_watch_health, args=(url, go, stop, sent))
    watcher.start()
    assert received.recv() == "ready"
    go.set()
    burst.began = time.perf_counter()
    await asyncio.gather(*(_trigger(url, token, key, burst) for key in keys))
    burst.seconds = time.perf_counter() - burst.began
    stop.set()
    burst.health_ms, burst.health_failures = received.recv()
    watcher.join()
    return burst


@dataclass
class Audit:
    stored: int  # runs with a burst label, counted before the retries
    stored_twice: int  # keys with more than one stored run
    lost: int  # acknowledged, but the retry returned another run or none
    unacknowledged: int  # stored during the burst without the caller being told
    never_returned: int  # stored, yet no retry of any key returns it


def _stored(client: httpx.Client) -> dict[int, str]:
    """Run id -> burst key of every stored burst run."""
    runs: dict[int, str] = {}
    offset = 0
    while True:
        page = client.get("/api/v1/runs", params={"limit": 500, "offset": offset}).json()
        runs |= {item["id"]: item["labels"]["burst"] for item in page["items"] if "burst" in item["labels"]}
        offset += 500
        if offset >= page["total"]:
            return runs


def audit(url: str, token: str, keys: list[str], burst: Burst) -> Audit:
    """Count what is stored, then send every key once more and compare."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_S) as client:
        stored = _stored(client)
        returned: dict[str, tuple[int, int]] = {}  # key -> (status, run id)
        for key in keys:
            body = {"profile": PROFILE, "labels": {"burst": key}}
            response = client.post("/api/v1/runs", json=body, headers={"Idempotency-Key": key})
            if response.status_code in (200, 201):
                returned[key] = (response.status_code, response.json()["id"])
    returned_ids = {run_id for _, run_id in returned.values()}
    return Audit(
        stored=len(stored),
        stored_twice=len(stored) - len(set(stored.values())),
        lost=sum(returned.get(key, (0, 0)) != (200, run_id) for key, run_id in burst.acknowledged.items()),
        unacknowledged=sum(status == 200 and key not in burst.acknowledged for key, (status, _) in returned.items()),
        never_returned=len(set(stored) - returned_ids),
    )


def percentile(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of the SQLite default")
    args = parser.parse_args()
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvc-burst-")))
        database_url = None
        if args.postgres:
            database_url = stack.enter_context(fresh_database(stack.enter_context(postgres_server())))
        url_for_tokens = database_url or f"sqlite:///{folder / 'kvcanary.db'}"
        upgrade(url_for_tokens)
        with session_scope(url_for_tokens) as session:
            token = create_token(session, "burst", Role.CI)
        base = stack.enter_context(serve(folder, database_url, ONE_FOR_MANY))
        keys = [f"burst-{i}" for i in range(args.requests)]
        burst = asyncio.run(fire(base, token, keys))
        checked = audit(base, token, keys, burst)
    database = "PostgreSQL" if args.postgres else "SQLite"
    p50, p99 = percentile(burst.health_ms, 50), percentile(burst.health_ms, 99)
    print(f"burst of {args.requests} concurrent triggers on {database}, answered in {burst.seconds:.1f} s")
    print(f"  status counts (every try):   {dict(sorted(burst.statuses.items()))}")
    print(f"  retried after 429/503:       {burst.retried_busy}")
    print(f"  5xx (besides 503):           {burst.server_errors}")
    print(f"  timeouts at {TIMEOUT_S:.0f} s:            {burst.timeouts}")
    print(f"  acknowledged / stored:       {len(burst.acknowledged)} / {checked.stored}")
    print(f"  stored twice:                {checked.stored_twice}")
    print(f"  acknowledged, not returned:  {checked.lost}")
    print(f"  stored unacknowledged:       {checked.unacknowledged}")
    print(f"  stored, never returned:      {checked.never_returned}")
    replies = " ".join(f"p{q} {percentile(burst.reply_s, q):.2f} s," for q in (50, 90, 99))
    print(
        f"  first reply after:           {min(burst.reply_s, default=float('nan')):.2f} s"
        f" (target < {FIRST_REPLY_TARGET_S:.0f} s)"
    )
    print(f"  reply times:                 {replies} last {max(burst.reply_s, default=float('nan')):.2f} s")
    print(
        f"  /healthz during the burst:   p50 {p50:.1f} ms, p99 {p99:.1f} ms over {len(burst.health_ms)} polls"
        f", {burst.health_failures} failed (target p99 < {HEALTH_TARGET_P99_MS:.0f} ms)"
    )


if __name__ == "__main__":
    main()
