"""A real `kvcanary serve` process on a temporary data folder, and tokens for each role."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from service.auth import Role, create_token
from service.db.migrate import upgrade
from service.db.session import session_scope
from service.engine.launcher import free_port
from tests.conftest import OFFLINE_ENV, require_engine_mark


@dataclass
class LiveService:
    """One `kvcanary serve` process; `restart()` and `kill()` act on the real process."""

    data_dir: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.data_dir / 'kvcanary.db'}"

    def start(self, timeout_s: float = 60) -> None:
        log = (self.data_dir / "serve.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--port", str(self.port)],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kvcanary serve exited {self.process.returncode}: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"kvcanary serve did not come up: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the service process only, as a crash would: its engine is left behind."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def log_tail(self) -> str:
        path = self.data_dir / "serve.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def token(self, role: Role, name: str | None = None) -> str:
        """A new token; without a name, one no other token of this service has (names are unique)."""
        upgrade(self.database_url)
        with session_scope(self.database_url) as session:
            return create_token(session, name or f"test-{role.value}-{uuid.uuid4().hex[:8]}", role)


class SubmitClient:
    """`kvcanary submit --wait` as a CI job runs it, in the background; its output (stdout and
    stderr) is read line by line as it comes."""

    def __init__(self, url: str, token: str, profile: str, *extra: str) -> None:
        argv = [sys.executable, "-m", "service", "submit", "--url", url, "--profile", profile, "--wait", *extra]
        env = {**os.environ, "KVCANARY_TOKEN": token}
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout or []:
            self.lines.append(line)

    def says(self, text: str, timeout_s: float = 60) -> None:
        """Wait until the still-running client has printed `text`."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert time.monotonic() < deadline and self.process.poll() is None, self.output()
            time.sleep(0.1)

    def exit_code(self, timeout_s: float = 60) -> int:
        code = self.process.wait(timeout_s)
        self._reader.join(10)
        return code

    def output(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        """End it if it still runs (a failed test must not leave it polling)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


StartService = Callable[..., LiveService]


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[StartService]:
    """`start_service(worker=False, **env)` starts `kvcanary serve` and stops it after the test."""
    started: list[LiveService] = []

    def start(
        worker: bool = False, data_dir: Path | None = None, start_timeout_s: float = 60, **extra_env: str
    ) -> LiveService:
        if worker and extra_env.get("KVCANARY_EXECUTOR", "local") == "local":
            require_engine_mark("a service whose worker runs engines here")
        folder = data_dir or tmp_path / "data"
        folder.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **OFFLINE_ENV,
            "KVCANARY_DATA_DIR": str(folder),
            "KVCANARY_START_WORKER": "true" if worker else "false",
            "KVCANARY_WORKER_POLL_S": "0.5",
            **extra_env,
        }
        service = LiveService(folder, env)
        service.start(start_timeout_s)
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()


@pytest.fixture(scope="module")
def idle_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """A `kvcanary serve` without a worker on a SQLite folder of its own, shared by one module."""
    folder = tmp_path_factory.mktemp("idle") / "data"
    folder.mkdir()
    env = {**os.environ, **OFFLINE_ENV, "KVCANARY_DATA_DIR": str(folder), "KVCANARY_START_WORKER": "false"}
    live = LiveService(folder, env)
    live.start()
    yield live
    live.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _fresh_postgres_database(server_url: str) -> str:
    """A new, empty database on the test PostgreSQL server; its URL."""
    from sqlalchemy import create_engine, text

    name = f"kvc_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return server_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database, not yet migrated: a SQLite file, and (where a server is up) PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kvcanary.db'}"
    server = os.environ.get("KVCANARY_TEST_POSTGRES_URL")
    if not server:
        pytest.skip("no PostgreSQL server: scripts/test.sh starts one (KVCANARY_TEST_POSTGRES_URL)")
    return _fresh_postgres_database(server)


@pytest.fixture
def database_url(empty_database: str) -> str:
    """A migrated, empty database: a SQLite file, and (where a server is up) PostgreSQL."""
    upgrade(empty_database)
    return empty_database


def answer_through(
    answers: list[httpx.Response], monkeypatch: pytest.MonkeyPatch, method: str = "POST"
) -> tuple[httpx.Response | None, list[float]]:
    """`kvcanary submit`'s answer loop over these replies in turn (a fake transport: a real
    service cannot be made to answer 429, 502 or 503 on a chosen request): its final response
    and the waits it took, with no real sleep."""
    from service.cli.submit import _answer, _Silence

    waits: list[float] = []
    monkeypatch.setattr("service.cli.submit.time.sleep", waits.append)
    transport = httpx.MockTransport(lambda request: answers.pop(0))
    with httpx.Client(base_url="http://kvcanary", transport=transport) as client:
        response = _answer(
            lambda: client.request(method, "/api/v1/runs"), _Silence(poll=2.0, give_up_s=60.0, deadline=float("inf"))
        )
    return response, waits
