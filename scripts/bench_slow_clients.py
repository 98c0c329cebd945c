"""Probe: half-sent request bodies held open against a real `kvcanary serve` (worker off), while
a ci trigger and a viewer read are timed.

Loopback only, bounded: at most 5,000 connections (default 1,100), held at most 120 s (default
20 s). Each sends the headers of `POST /api/v1/runs` with `Content-Length: 100` and one byte of
body, from 127.0.0.2 on (`--sources` addresses, so that a per-client connection cap is not
what decides the outcome; `--sources 1` puts them all on one address). Once they are all
sent, every `--every-s` a ci trigger (`POST /api/v1/runs`, the whole body) and a viewer read
(`GET /api/v1/runs`) are sent from 127.0.0.1, each on a connection of its own, and timed, with
`/healthz` and `/readyz`.

Prints: the half-sent connections' outcome (answered with which status, or still open at the
end), and per probe the status and seconds of the trigger and the read. Target: every trigger
201 and every read 200, each within 1 s, while the half-sent bodies are held.

    .venv/bin/python scripts/bench_slow_clients.py [--connections 1100] [--hold-s 20] [--sources 11]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_burst import serve  # noqa: E402

from service.auth import Role, create_token  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402
from service.db.session import session_scope  # noqa: E402

PROFILE = "kimi-linear-48b-a3b"
MAX_CONNECTIONS = 5000
MAX_HOLD_S = 120.0
TARGET_S = 1.0


@dataclass
class Probe:
    """One timed request: what it was, its status (or the error), and its seconds."""

    what: str
    status: str
    seconds: float


@dataclass
class Held:
    opened: int = 0
    refused_at_connect: int = 0
    answered: Counter[str] = field(default_factory=Counter)  # status line of the answer, once it came


async def _request(host: str, port: int, head: str, body: bytes = b"", timeout_s: float = 10.0) -> tuple[str, float]:
    """A whole request on a new connection from 127.0.0.1; its status and seconds to the status line."""
    began = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError) as exc:
        return type(exc).__name__, time.perf_counter() - began
    try:
        writer.write(head.encode() + body)
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        status = line.split()[1].decode() if len(line.split()) > 1 else "closed"
    except (OSError, TimeoutError) as exc:
        status = type(exc).__name__
    finally:
        writer.close()
    return status, time.perf_counter() - began


async def _trigger(host: str, port: int, token: str, n: int) -> Probe:
    body = json.dumps({"profile": PROFILE, "labels": {"probe": str(n)}}).encode()
    head = (
        f"POST /api/v1/runs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return Probe("ci trigger", *await _request(host, port, head, body))


async def _get(host: str, port: int, path: str, what: str, token: str | None = None) -> Probe:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"
    return Probe(what, *await _request(host, port, head))


async def _half_send(host: str, port: int, source: str, held: Held, release: asyncio.Event) -> None:
    """Headers and one byte of a 100-byte body, then nothing until `release`; notes any answer."""
    try:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    except OSError:
        held.refused_at_connect += 1
        return
    held.opened += 1
    head = (
        f"POST /api/v1/runs HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    )
    try:
        writer.write(head.encode())
        read = asyncio.ensure_future(reader.readline())
        done, _ = await asyncio.wait({read, asyncio.ensure_future(release.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if read in done and not read.exception():
            line = read.result()
            held.answered[line.split()[1].decode() if len(line.split()) > 1 else "closed"] += 1
        else:
            read.cancel()
    except OSError:
        held.answered["reset"] += 1
    finally:
        writer.close()


async def probe(url: str, ci: str, viewer: str, args: argparse.Namespace) -> tuple[Held, list[Probe], float]:
    host, port = url.removeprefix("http://").split(":")
    held, release = Held(), asyncio.Event()
    sources = [f"127.0.0.{2 + i}" for i in range(args.sources)]
    began = time.perf_counter()
    holders = [
        asyncio.ensure_future(_half_send(host, int(port), sources[i % len(sources)], held, release))
        for i in range(args.connections)
    ]
    await asyncio.sleep(1.0)  # every connection sent its headers and its byte
    sent_s = time.perf_counter() - began
    probes: list[Probe] = []
    n = 0
    while time.perf_counter() - began < args.hold_s:
        n += 1
        probes.append(await _trigger(host, int(port), ci, n))
        probes.append(await _get(host, int(port), "/api/v1/runs?limit=5", "viewer read", viewer))
        probes.append(await _get(host, int(port), "/healthz", "/healthz"))
        probes.append(await _get(host, int(port), "/readyz", "/readyz"))
        await asyncio.sleep(args.every_s)
    release.set()
    await asyncio.gather(*holders)
    return held, probes, sent_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=1100)
    parser.add_argument("--hold-s", type=float, default=20.0)
    parser.add_argument("--every-s", type=float, default=2.0)
    parser.add_argument("--sources", type=int, default=11, help="loopback addresses the half-sent bodies come from")
    args = parser.parse_args()
    if not 1 <= args.connections <= MAX_CONNECTIONS or not 0 < args.hold_s <= MAX_HOLD_S:
        sys.exit(f"--connections 1..{MAX_CONNECTIONS} and --hold-s up to {MAX_HOLD_S:g}: this probe stays bounded")
    if not 1 <= args.sources <= 250:
        sys.exit("--sources 1..250 (127.0.0.2 to 127.0.0.251)")
    with tempfile.TemporaryDirectory(prefix="kvc-slow-") as tmp:
        folder = Path(tmp)
        url_for_tokens = f"sqlite:///{folder / 'kvcanary.db'}"
        upgrade(url_for_tokens)
        with session_scope(url_for_tokens) as session:
            ci, viewer = create_token(session, "probe-ci", Role.CI), create_token(session, "probe-viewer", Role.VIEWER)
        with serve(folder, None) as url:
            held, probes, sent_s = asyncio.run(probe(url, ci, viewer, args))
    print(
        f"half-sent bodies: {args.connections} from {args.sources} loopback address(es), held {args.hold_s:g} s; "
        f"{held.opened} connected ({sent_s:.1f} s to send), {held.refused_at_connect} refused at connect"
    )
    answered = ", ".join(f"{status}: {n}" for status, n in sorted(held.answered.items())) or "none"
    print(f"  answered while held: {answered}; still open at release: {held.opened - sum(held.answered.values())}")
    for what in ("ci trigger", "viewer read", "/healthz", "/readyz"):
        mine = [p for p in probes if p.what == what]
        statuses = Counter(p.status for p in mine)
        seconds = [p.seconds for p in mine]
        within = sum(p.seconds <= TARGET_S and p.status.startswith("2") for p in mine)
        print(
            f"  {what:12s} {len(mine)} probes: statuses {dict(statuses)}; seconds p50 {statistics.median(seconds):.3f} "
            f"max {max(seconds):.3f}; 2xx within {TARGET_S:g} s: {within}/{len(mine)}"
        )


if __name__ == "__main__":
    main()
