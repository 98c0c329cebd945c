"""The one retry rule, against a real HTTP server: what is retried, how long between tries, when it stops.

The WER and drift clients (through `evals.retry.send`) and the alert webhooks run
`evals.retry.policy`; the webhook sender and the async sender are exercised whole here, and the
policy itself through tenacity with the waits recorded instead of slept.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from tenacity import Retrying

from evals import retry
from evals.retry_after import MAX_RETRY_AFTER_S
from service.alerting import webhooks
from service.engine.launcher import free_port


class Script:
    """A server that answers each request with the next (status, headers) of `answers`, then 200."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, str]]] = []
        self.seen = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        script = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, headers = script.answers[script.seen] if script.seen < len(script.answers) else (200, {})
                script.seen += 1
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(b"answer")

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def script() -> Iterator[Script]:
    server = Script()
    yield server
    server.server.shutdown()


def _run_policy(url: str, attempts: int) -> tuple[list[float], httpx.Response | BaseException]:
    waits: list[float] = []
    retrying = Retrying(**retry.policy(attempts, base_s=1.0, cap_s=4.0), sleep=waits.append)
    try:
        outcome: httpx.Response | BaseException = retrying(lambda: retry.check(httpx.post(url, json={})))
    except (httpx.HTTPError, retry.RetryableStatus) as exc:
        outcome = exc
    return waits, outcome


@pytest.mark.parametrize("status", [408, 429, 500, 501, 503])
def test_timeouts_throttling_and_server_errors_are_retried(script: Script, status: int) -> None:
    script.answers = [(status, {}), (status, {})]
    waits, outcome = _run_policy(script.url, attempts=4)
    assert isinstance(outcome, httpx.Response) and outcome.status_code == 200
    assert (script.seen, waits) == (3, [1.0, 2.0])  # exponential from base_s


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_client_errors_are_final(script: Script, status: int) -> None:
    script.answers = [(status, {})]
    waits, outcome = _run_policy(script.url, attempts=4)
    assert isinstance(outcome, httpx.Response) and outcome.status_code == status
    assert (script.seen, waits) == (1, [])


def test_retry_after_sets_the_wait_and_backoff_is_capped(script: Script) -> None:
    script.answers = [(503, {"Retry-After": "7"}), (429, {"Retry-After": "0"}), (503, {}), (503, {}), (503, {})]
    waits, outcome = _run_policy(script.url, attempts=5)
    assert waits == [7.0, 0.0, 4.0, 4.0]  # the server's word, then 2**n from base_s, capped at cap_s
    assert isinstance(outcome, retry.RetryableStatus) and outcome.response.status_code == 503


def test_retry_after_as_an_http_date_sets_the_wait(script: Script) -> None:
    """The date form, read by `evals.retry_after` as the CLI client reads it (one rule, one cap)."""
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    script.answers = [(503, {"Retry-After": soon}), (503, {"Retry-After": "86400"})]
    waits, outcome = _run_policy(script.url, attempts=3)
    assert isinstance(outcome, httpx.Response) and outcome.status_code == 200
    assert 25.0 <= waits[0] <= 30.0 and waits[1] == MAX_RETRY_AFTER_S


def test_connection_errors_are_retried_until_attempts_run_out() -> None:
    closed = f"http://127.0.0.1:{free_port()}/hook"
    waits, outcome = _run_policy(closed, attempts=3)
    assert isinstance(outcome, httpx.ConnectError) and waits == [1.0, 2.0]


def test_webhook_delivery_follows_the_rule(script: Script) -> None:
    script.answers = [(502, {"Retry-After": "0"}), (429, {"Retry-After": "0"})]
    delivered = webhooks.post(script.url, {"text": "hi"}, attempts=4, backoff_s=30)
    assert (delivered.ok, delivered.attempts, script.seen) == (True, 3, 3)

    script.answers, script.seen = [(404, {})], 0
    refused = webhooks.post(script.url, {"text": "hi"}, attempts=4, backoff_s=30)
    assert (refused.ok, refused.attempts, script.seen) == (False, 1, 1) and refused.detail.startswith("HTTP 404")

    stop = threading.Event()
    stop.set()
    script.answers, script.seen = [(503, {})], 0
    stopped = webhooks.post(script.url, {"text": "hi"}, attempts=4, backoff_s=30, stop=stop)
    assert (stopped.ok, stopped.attempts) == (False, 1) and "service stopped" in stopped.detail


def test_the_suites_async_sender_follows_the_rule(script: Script) -> None:
    """`retry.send`, which the WER and drift suites' requests go through (no waits: base 0)."""
    import asyncio

    async def attempt(url: str, before_each: Any = lambda: None) -> tuple[httpx.Response | None, str, int]:
        async with httpx.AsyncClient() as client:
            return await retry.send(lambda: client.post(url, json={}), 4, 0.0, 0.0, before_each=before_each)

    script.answers = [(503, {}), (502, {})]
    response, error, tries = asyncio.run(attempt(script.url))
    assert response is not None and (response.status_code, error, tries, script.seen) == (200, "", 3, 3)

    script.answers, script.seen = [(404, {})], 0
    response, error, tries = asyncio.run(attempt(script.url))
    assert response is not None and (response.status_code, tries) == (404, 1)  # final: the caller reads it

    script.answers, script.seen = [(503, {})] * 5, 0
    response, error, tries = asyncio.run(attempt(script.url))
    assert (response, tries, script.seen) == (None, 4, 4) and error.startswith("HTTP 503")

    response, error, tries = asyncio.run(attempt(f"http://127.0.0.1:{free_port()}/x"))
    assert (response, tries) == (None, 4) and error.startswith("ConnectError")

    def stopped() -> None:
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        asyncio.run(attempt(script.url, stopped))
