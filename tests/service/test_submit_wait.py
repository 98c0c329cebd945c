"""`kvcanary submit --wait` while its service is killed -9: a real `kvcanary serve` without a
worker (the run stays queued until the test ends it), killed and started again on its port.

The gate end to end (test_gate_e2e.py) does the same around a real engine run.
"""

from __future__ import annotations

import functools
import time

import httpx
import pytest
from typer.testing import CliRunner

from service.auth import Role
from service.cli import app
from tests.service.conftest import LiveService, StartService, SubmitClient, bearer

PROFILE = "gsm8k-tiny-cpu"


def submit(service: LiveService, *extra: str) -> SubmitClient:
    return SubmitClient(service.url, service.token(Role.CI), PROFILE, "--poll", "0.2", *extra)


def cancel_and_see_it_followed(service: LiveService, client: SubmitClient, run_id: int) -> None:
    """The run, which no worker picks up, is cancelled (by an admin: the client's token is its own):
    a client that follows it exits 2 with its status."""
    cancel = httpx.post(f"{service.url}/api/v1/runs/{run_id}/cancel", headers=bearer(service.token(Role.ADMIN)))
    assert cancel.status_code == 200, cancel.text
    assert client.exit_code() == 2, client.output()
    assert "cancelled" in client.output()


@pytest.fixture
def service(start_service: StartService) -> LiveService:
    return start_service()


def test_submit_rides_out_a_restart_and_follows_its_run_to_the_end(service: LiveService) -> None:
    client = submit(service)
    try:
        client.says("queued")
        [run] = httpx.get(f"{service.url}/api/v1/runs").json()["items"]
        service.kill()
        client.says("service not answering (ConnectError)")
        service.start()  # the same port and database: the run is still there
        cancel_and_see_it_followed(service, client, run["id"])
    finally:
        client.kill()


def test_submit_gives_up_on_a_service_that_stays_down(service: LiveService) -> None:
    client = submit(service, "--unreachable-timeout", "2")
    try:
        client.says("queued")
        service.kill()
        began = time.monotonic()
        assert client.exit_code() == 2, client.output()
        assert time.monotonic() - began < 30
        assert "did not answer for 2 s" in client.output(), client.output()
    finally:
        client.kill()


@pytest.mark.parametrize(
    ("option", "value", "floor"),
    [("--unreachable-timeout", "-1", "0"), ("--timeout", "-5", "0"), ("--poll", "0", "0.1")],
)
def test_submit_refuses_waits_below_their_floor(option: str, value: str, floor: str) -> None:
    """A negative limit would give up at the first poll, and a poll of 0 would hammer the
    service: both are refused before anything is sent (the URL is never asked)."""
    code, output, _ = run_cli("--url", "http://127.0.0.1:9", option, value)
    assert code == 2
    assert f"Invalid value for '{option}'" in output and f"greater than or equal to {floor}" in output


def test_submit_to_a_service_that_is_down_queues_its_run_once_it_is_back(service: LiveService) -> None:
    """A refused POST is asked again (under the call's own Idempotency-Key) until the service
    is back, and queues one run, which the call then follows."""
    service.kill()
    client = submit(service)
    try:
        client.says("service not answering (ConnectError)")
        service.start()
        client.says("queued")
        [run] = httpx.get(f"{service.url}/api/v1/runs").json()["items"]
        cancel_and_see_it_followed(service, client, run["id"])
    finally:
        client.kill()


def run_cli(*args: str) -> tuple[int, str, float]:
    """`kvcanary submit` in this process: exit code, output, seconds taken."""
    began = time.monotonic()
    result = CliRunner().invoke(app, ["submit", "--profile", PROFILE, "--poll", "0.2", *args])
    return result.exit_code, " ".join(result.output.replace("│", " ").split()), time.monotonic() - began


@pytest.mark.parametrize("limits", [["--unreachable-timeout", "1"], ["--timeout", "1", "--unreachable-timeout", "600"]])
def test_submit_gives_up_a_post_nobody_answers_at_the_first_limit(limits: list[str]) -> None:
    """Port 9 on this host refuses connections (a real refusal): the POST is tried every poll
    until --unreachable-timeout or --timeout, whichever comes first."""
    code, output, took = run_cli("--url", "http://127.0.0.1:9", *limits)
    assert code == 2, output
    assert "service not answering (ConnectError)" in output
    assert "did not answer for 1 s; no run id came back" in output
    assert took < 10


def test_submit_does_not_retry_a_url_it_cannot_use() -> None:
    """A URL without a scheme never starts working: it fails at once, not after the limit."""
    code, output, took = run_cli("--url", "localhost:9")
    assert code == 2 and "unreachable or failing" in output and "not answering" not in output
    assert took < 10


def test_a_resent_post_carries_the_key_the_call_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake transport: a real service cannot be made to lose its answer to a POST that it
    took. The first POST times out; the second carries the same generated Idempotency-Key (the
    service then returns the run the first one queued)."""
    keys: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["Idempotency-Key"])
        if len(keys) == 1:
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return httpx.Response(422, json={"detail": "stop here"})

    monkeypatch.setattr(
        "service.cli.submit.httpx.Client", functools.partial(httpx.Client, transport=httpx.MockTransport(answer))
    )
    code, output, _ = run_cli("--url", "http://kvcanary")
    assert code == 2 and "service not answering (ReadTimeout)" in output and "stop here" in output
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0].startswith("kvcanary-submit-")
