"""Benchmark: every release page and API on a database at the mission's scale, and what readers cost a trigger.

Seeds two SQLite files with `scripts/seed_release_scale.py` (3,000 runs, 90 nightly releases,
10-arm mutation batches), one at 1,319 items (all of GSM8k) and one at 200, starts a real
`kvcanary serve` (worker off) on each and reads every release page and API, the profile page
and its `/mutants`, the runs list, a run and the compare view: the first request, then the p50
and p95 of `--requests` more. Then eight anonymous readers loop on the release page and
`/mutants` while a ci token triggers runs and reads `GET /api/v1/runs/1`: the delay each gets
against the same request with no readers. Targets: release page and `/mutants` p95 <= 0.2 s,
the trigger's delay under load < 1 s. Each row prints the ratio of its 1,319-item time to the
200-item one beside it (flat: the read does not grow with the items).

    python scripts/bench_releases.py [--requests 20] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from bench_postgres_api import free_port
from seed_release_scale import CI_TOKEN, KEY, RELEASES, REQUIRED, release_value, seed, write_profiles

ROOT = Path(__file__).resolve().parent.parent
PAGE_TARGET_S = 0.2
DELAY_TARGET_S = 1.0
READERS = 8
TARGETED = ("release page", "mutants API")


@contextmanager
def serve(database_url: str, folder: Path) -> Iterator[str]:
    """`kvcanary serve` on the seeded file, worker off, the two nightly profiles required."""
    profiles = folder / "profiles"
    write_profiles(profiles)
    port = free_port()
    env = {
        **os.environ, "KVCANARY_DATABASE_URL": database_url, "KVCANARY_DATA_DIR": str(folder),
        "KVCANARY_PROFILES_DIR": str(profiles), "KVCANARY_START_WORKER": "false",
        "KVCANARY_RELEASE_REQUIRED_PROFILES": ",".join(REQUIRED),
    }  # fmt: skip
    log = (folder / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"kvcanary serve did not come up: {(folder / 'serve.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def pages(newest: str, oldest: str, deciding: int, previous: int, profile: str) -> dict[str, str]:
    release = quote(f"{KEY}={newest}", safe="=")
    return {
        "release page": f"/releases/{release}",
        "release API": f"/api/v1/releases/{release}",
        "release page, oldest": f"/releases/{quote(f'{KEY}={oldest}', safe='=')}",
        "releases index": "/releases",
        "releases API": "/api/v1/releases",
        "mutants API": f"/api/v1/profiles/{profile}/mutants",
        "profile page": f"/profiles/{profile}",
        "runs page": "/runs",
        "run page": f"/runs/{deciding}",
        "run API": f"/api/v1/runs/{deciding}",
        "compare page": f"/compare/{previous}/{deciding}",
    }


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def time_pages(url: str, paths: dict[str, str], requests: int) -> dict[str, dict[str, float]]:
    found = {}
    with httpx.Client(base_url=url, timeout=300) as client:
        for name, path in paths.items():
            began = time.perf_counter()
            client.get(path).raise_for_status()
            first = time.perf_counter() - began
            warm = []
            for _ in range(requests):
                began = time.perf_counter()
                client.get(path).raise_for_status()
                warm.append(time.perf_counter() - began)
            found[name] = {"first": first, "p50": statistics.median(warm), "p95": p95(warm)}
    return found


def _trigger(client: httpx.Client, n: int) -> float:
    body = {"profile": REQUIRED[0], "labels": {"git_sha": f"bench{n:04d}"}}
    began = time.perf_counter()
    client.post("/api/v1/runs", json=body).raise_for_status()
    return time.perf_counter() - began


def _read_run(client: httpx.Client, _: int) -> float:
    began = time.perf_counter()
    client.get("/api/v1/runs/1").raise_for_status()
    return time.perf_counter() - began


def under_load(url: str, paths: dict[str, str], tries: int) -> dict[str, dict[str, float]]:
    """A ci trigger's and a run read's median seconds alone, then with eight anonymous readers looping."""
    headers = {"Authorization": f"Bearer {CI_TOKEN}"}
    measured: dict[str, dict[str, float]] = {}
    with httpx.Client(base_url=url, headers=headers, timeout=300) as client:
        for name, call in (("ci trigger", _trigger), ("GET /api/v1/runs/1", _read_run)):
            measured[name] = {"idle": statistics.median(call(client, n) for n in range(tries))}
        stop = threading.Event()

        def read(path: str) -> None:
            with httpx.Client(base_url=url, timeout=300) as reader:
                while not stop.is_set():
                    try:
                        reader.get(path)
                    except httpx.HTTPError:  # a read slower than the timeout: the next one starts
                        continue

        loop = [paths["release page"], paths["mutants API"]]
        readers = [threading.Thread(target=read, args=(loop[k % 2],), daemon=True) for k in range(READERS)]
        for reader in readers:
            reader.start()
        time.sleep(2)
        for name, call in (("ci trigger", _trigger), ("GET /api/v1/runs/1", _read_run)):
            loaded = [call(client, 1000 + n) for n in range(tries)]
            measured[name].update(loaded=statistics.median(loaded), worst=max(loaded))
        stop.set()
        for reader in readers:
            reader.join(600)
    return measured


def measure(items: int, requests: int, tries: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"kvc-release-bench-{items}-") as name:
        folder = Path(name)
        url = f"sqlite:///{folder / 'kvcanary.db'}"
        began = time.perf_counter()
        seeder = seed(url, items)
        seeded_s = time.perf_counter() - began
        newest, oldest = release_value(RELEASES - 1), release_value(1)
        deciding = seeder.deciding[newest][REQUIRED[0]]
        previous = seeder.deciding[release_value(RELEASES - 2)][REQUIRED[0]]
        paths = pages(newest, oldest, deciding, previous, REQUIRED[0])
        with serve(url, folder) as served:
            timings = time_pages(served, paths, requests)
            load = under_load(served, paths, tries)
    return {"items": items, "runs": seeder.next_id - 1, "seeded_s": seeded_s, "pages": timings, "load": load}


def report(big: dict[str, Any], small: dict[str, Any], requests: int) -> None:
    print(
        f"{big['runs']} runs, {RELEASES} releases, 10-arm batches; {requests} requests per page after the first; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    header = f"{'page':<22} {'first s':>8} {'p50 s':>8} {'p95 s':>8} {'200-item p95 s':>15} {'ratio':>7} {'target':>8}"
    print(header)
    for name, t in big["pages"].items():
        other = small["pages"][name]["p95"]
        verdict = ("meets" if t["p95"] <= PAGE_TARGET_S else "MISSES") if name in TARGETED else ""
        print(
            f"{name:<22} {t['first']:8.3f} {t['p50']:8.3f} {t['p95']:8.3f} {other:15.3f} "
            f"{t['p95'] / other:7.1f} {verdict:>8}"
        )
    print(f"{'under 8 readers':<22} {'idle s':>8} {'loaded s':>8} {'worst s':>8} {'200-item delay':>15} {'delay s':>8}")
    for name, t in big["load"].items():
        other = small["load"][name]
        delay = t["loaded"] - t["idle"]
        verdict = ("meets" if delay < DELAY_TARGET_S else "MISSES") if name == "ci trigger" else ""
        print(
            f"{name:<22} {t['idle']:8.3f} {t['loaded']:8.3f} {t['worst']:8.3f} "
            f"{other['loaded'] - other['idle']:15.3f} {delay:8.3f} {verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="timed requests per page after the first")
    parser.add_argument("--tries", type=int, default=5, help="triggers and run reads, idle and under load")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args()
    small = measure(200, args.requests, args.tries)
    big = measure(1319, args.requests, args.tries)
    report(big, small, args.requests)
    if args.json:
        args.json.write_text(json.dumps({"1319": big, "200": small}, indent=2))


if __name__ == "__main__":
    main()
