"""`kvcanary submit --wait` while its service is killed -9: a real `kvcanary serve` without a
worker (the run stays queued until the test ends it), killed and started again on its port.

The gate end to end (test_gate_e2e.py) does the same around a real engine run.
"""

from __future__ import annotations

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
    """The run, which no worker picks up, is cancelled: a client that follows it exits 2 with its status."""
    cancel = httpx.post(f"{service.url}/api/v1/runs/{run_id}/cancel", headers=bearer(service.token(Role.CI)))
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
    result = CliRunner().invoke(app, ["submit", "--url", "http://127.0.0.1:9", "--profile", PROFILE, option, value])
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.output
    assert f"greater than or equal to {floor}" in " ".join(result.output.replace("│", " ").split())


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
