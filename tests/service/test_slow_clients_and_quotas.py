"""Clients that take the service's places without using them, and tokens that take the queue:
half-sent requests answered 408 and never counted in flight, a per-client connection cap,
`/readyz`, queue quotas answered 429 with Retry-After naming the limit, and callers served in
turn. Against real `kvcanary serve` processes with small limits (scripts/bench_slow_clients.py
and scripts/bench_flood.py measure the full-size cases)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from service.app import create_app
from service.auth import Role
from service.db.models import Run
from service.db.session import session_scope
from service.runs import queue
from service.settings import Settings
from tests.service.conftest import LiveService, StartService, bearer

PROFILE = "kimi-linear-48b-a3b"
HALF_SENT = b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"


@contextmanager
def half_sent(
    service: LiveService, count: int, source: str = "127.0.0.2", request: bytes = HALF_SENT
) -> Iterator[list[socket.socket]]:
    """`count` connections from `source`, each having sent `request` and nothing more."""
    with ExitStack() as stack:
        held = []
        for _ in range(count):
            connection = stack.enter_context(socket.create_connection(("127.0.0.1", service.port), 10, (source, 0)))
            connection.sendall(request)
            held.append(connection)
        yield held


def status_of(connection: socket.socket, timeout_s: float = 10) -> int:
    """The status of the answer on `connection`, waiting for it at most `timeout_s`."""
    connection.settimeout(timeout_s)
    line = connection.recv(4096).split(b"\r\n", 1)[0]
    return int(line.split()[1])


def test_half_sent_bodies_hold_no_place_in_flight(start_service: StartService) -> None:
    """1,100 half-sent bodies used to fill the 1,024 places in flight; here 8 against 4 places:
    a ci trigger and a viewer read are still answered, and /readyz says ready."""
    service = start_service(KVCANARY_MAX_IN_FLIGHT="4", KVCANARY_READ_AUTH="true")
    ci, viewer = bearer(service.token(Role.CI)), bearer(service.token(Role.VIEWER))
    with half_sent(service, 8):
        trigger = httpx.post(f"{service.url}/api/v1/runs", json={"profile": PROFILE}, headers=ci, timeout=10)
        assert trigger.status_code == 201, trigger.text
        assert httpx.get(f"{service.url}/api/v1/runs", headers=viewer, timeout=10).status_code == 200
        ready = httpx.get(f"{service.url}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json() == {"status": "ready", "in_flight": 0, "limit": 4}


def test_a_body_or_headers_that_do_not_arrive_in_time_get_408(start_service: StartService) -> None:
    service = start_service(KVCANARY_BODY_TIMEOUT_S="0.5", KVCANARY_HEADER_TIMEOUT_S="0.5")
    with (
        half_sent(service, 1) as [body_late],
        half_sent(service, 1, request=b"POST /api/v1/runs HTTP/1.1\r\nHo") as [headers_late],
    ):
        assert status_of(body_late) == 408
        assert status_of(headers_late) == 408
    assert httpx.get(f"{service.url}/api/v1/runs", timeout=10).status_code == 200


def test_one_client_address_holds_at_most_its_cap_of_connections(start_service: StartService) -> None:
    service = start_service(KVCANARY_MAX_CONNECTIONS_PER_CLIENT="3")
    with half_sent(service, 3, "127.0.0.3"):
        with half_sent(service, 1, "127.0.0.3") as [over]:
            over.settimeout(10)
            answer = over.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 429") and "retry-after: 5" in answer.lower(), answer
        assert "KVCANARY_MAX_CONNECTIONS_PER_CLIENT=3" in answer
        assert httpx.get(f"{service.url}/api/v1/runs", timeout=10).status_code == 200  # another address


def test_readyz_says_busy_while_api_requests_are_refused(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", start_worker=False, max_in_flight=2)
    app = create_app(settings)
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        app.state.load.in_flight = 2  # as two requests in flight would hold it
        busy = client.get("/readyz")
        assert busy.status_code == 503 and busy.headers["Retry-After"].isdigit()
        assert busy.json()["status"] == "busy"
        assert client.get("/api/v1/runs").status_code == 503
        assert client.get("/healthz").status_code == 200  # alive all the same


def _trigger(service: LiveService, token: str, arms: list[str] | None = None, key: str | None = None) -> httpx.Response:
    body: dict[str, object] = {"profile": PROFILE, **({"compare": arms} if arms else {})}
    headers = {**bearer(token), **({"Idempotency-Key": key} if key else {})}
    return httpx.post(f"{service.url}/api/v1/runs", json=body, headers=headers, timeout=10)


def _refused_by(answer: httpx.Response, limit: str) -> None:
    assert answer.status_code == 429, answer.text
    assert answer.headers["Retry-After"].isdigit()
    assert f"over the limit {limit} = " in answer.json()["detail"]


def test_queue_quotas_per_token_and_in_all_answer_429_naming_the_limit(start_service: StartService) -> None:
    service = start_service(
        KVCANARY_MAX_QUEUED_RUNS_PER_TOKEN="3",
        KVCANARY_MAX_QUEUED_ENGINE_LOADS_PER_TOKEN="5",
        KVCANARY_MAX_QUEUED_RUNS="5",
    )
    flood, other, admin = service.token(Role.CI), service.token(Role.CI), service.token(Role.ADMIN)
    two_arms = ["stock", "fixed"]
    assert _trigger(service, flood, two_arms, "a").status_code == 201
    assert _trigger(service, flood, two_arms).status_code == 201
    _refused_by(_trigger(service, flood, two_arms), "max_queued_engine_loads_per_token")
    assert _trigger(service, flood, two_arms, "a").status_code == 200  # a retry of a queued run is not a new one
    assert _trigger(service, flood).status_code == 201  # 5 engine loads, 3 runs
    _refused_by(_trigger(service, flood), "max_queued_runs_per_token")
    assert _trigger(service, other).status_code == 201
    assert _trigger(service, other).status_code == 201
    _refused_by(_trigger(service, other), "max_queued_runs")

    url = f"{service.url}/api/v1/quotas"
    shown = {q["name"]: q for q in httpx.get(url).json()}
    assert shown["max_queued_runs"]["value"] == 5 and shown["max_queued_runs"]["changed_by"] is None
    assert httpx.put(url, json={"max_queued_runs": 50}, headers=bearer(flood)).status_code == 403
    assert httpx.put(url, json={"max_queued_runs": 0}, headers=bearer(admin)).status_code == 422
    changed = {q["name"]: q for q in httpx.put(url, json={"max_queued_runs": 50}, headers=bearer(admin)).json()}
    assert changed["max_queued_runs"]["value"] == 50 and changed["max_queued_runs"]["default"] == 5
    assert _trigger(service, other).status_code == 201


def test_queued_runs_start_with_callers_in_turn(database_url: str) -> None:
    """One caller's backlog does not hold another's next run: the caller whose last run started
    longest ago (or never) goes next."""
    with session_scope(database_url) as session:
        for caller in ["flood"] * 4 + ["team-b", "team-c", "team-b"]:
            queue.enqueue(
                session,
                profile=PROFILE,
                trigger="api",
                triggered_by=caller,
                labels={},
                overrides={},
                arms=[],
                max_attempts=1,
            )
    order = []
    while True:
        with session_scope(database_url) as session:
            run = queue.claim_next(session, "test:0")
            if run is None:
                break
            order.append(run.triggered_by)
    assert order == ["flood", "team-b", "team-c", "flood", "team-b", "flood", "flood"]
    with session_scope(database_url) as session:
        assert session.query(Run).filter(Run.status == "queued").count() == 0
