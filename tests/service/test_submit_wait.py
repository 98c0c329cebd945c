"""`kvcanary submit --wait` while its service is killed -9: a real `kvcanary serve` without a
worker (the run stays queued until the test ends it), killed and started again on its port.

The gate end to end (test_gate_e2e.py) does the same around a real engine run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from service.auth import Role
from tests.service.conftest import LiveService, StartService, bearer

PROFILE = "gsm8k-tiny-cpu"


class Client:
    """`kvcanary submit --wait` in the background, its output read line by line as it comes."""

    def __init__(self, service: LiveService, *extra: str) -> None:
        env = {**os.environ, "KVCANARY_TOKEN": service.token(Role.CI)}
        argv = [sys.executable, "-m", "service", "submit", "--url", service.url, "--profile", PROFILE]
        argv += ["--wait", "--poll", "0.2", *extra]
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout or []:
            self.lines.append(line)

    def says(self, text: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert time.monotonic() < deadline and self.process.poll() is None, "".join(self.lines)
            time.sleep(0.1)

    def exit_code(self, timeout_s: float = 60) -> int:
        code = self.process.wait(timeout_s)
        self._reader.join(10)
        return code

    def output(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def service(start_service: StartService) -> LiveService:
    return start_service()


def test_submit_rides_out_a_restart_and_follows_its_run_to_the_end(service: LiveService) -> None:
    client = Client(service)
    try:
        client.says("queued")
        [run] = httpx.get(f"{service.url}/api/v1/runs").json()["items"]
        service.kill()
        client.says("service not answering (ConnectError)")
        service.start()  # the same port and database: the run is still there
        cancel = httpx.post(f"{service.url}/api/v1/runs/{run['id']}/cancel", headers=bearer(service.token(Role.CI)))
        assert cancel.status_code == 200, cancel.text
        assert client.exit_code() == 2, client.output()
        assert "cancelled" in client.output()
    finally:
        client.kill()


def test_submit_gives_up_on_a_service_that_stays_down(service: LiveService) -> None:
    client = Client(service, "--unreachable-timeout", "2")
    try:
        client.says("queued")
        service.kill()
        began = time.monotonic()
        assert client.exit_code() == 2, client.output()
        assert time.monotonic() - began < 30
        assert "did not answer for 2 s" in client.output(), client.output()
    finally:
        client.kill()
