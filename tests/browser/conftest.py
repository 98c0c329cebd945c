"""The dashboard in Debian's Chromium, driven by Playwright, against a real `kvcanary serve`.

No browser is ever downloaded: Playwright launches /usr/bin/chromium. One service process
with a seeded SQLite file serves every test of the session; a test that needs another
configuration (reads behind a login) starts its own.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import ConsoleMessage, Page

from service.db.migrate import upgrade
from tests.browser.seed import PROFILES, Seeded, seed
from tests.conftest import OFFLINE_ENV
from tests.service.conftest import LiveService, free_port

CHROMIUM = Path(os.environ.get("KVCANARY_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install chromium` or set KVCANARY_TEST_CHROMIUM")
    return {**browser_type_launch_args, "executable_path": str(CHROMIUM), "args": CHROMIUM_ARGS}


def start_dashboard(data_dir: Path, **extra_env: str) -> LiveService:
    """`kvcanary serve` on a free port, worker off (seeded runs stay as seeded), the seed's profiles."""
    profiles = data_dir / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    for name, text in PROFILES.items():
        (profiles / f"{name}.yaml").write_text(text)
    port = free_port()
    env = {
        **os.environ,
        **OFFLINE_ENV,
        "KVCANARY_DATA_DIR": str(data_dir),
        "KVCANARY_PORT": str(port),
        "KVCANARY_START_WORKER": "false",
        "KVCANARY_PROFILES_DIR": str(profiles),
        **extra_env,
    }
    service = LiveService(data_dir, env, port=port)
    service.start()
    return service


@dataclass
class Dashboard:
    service: LiveService
    seeded: Seeded

    @property
    def url(self) -> str:
        return self.service.url

    @property
    def database_url(self) -> str:
        return self.service.database_url


@pytest.fixture(scope="session")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    data_dir = tmp_path_factory.mktemp("dashboard")
    database_url = f"sqlite:///{data_dir / 'kvcanary.db'}"
    upgrade(database_url)
    seeded = seed(database_url)
    service = start_dashboard(data_dir)
    try:
        yield Dashboard(service, seeded)
    finally:
        service.stop()


@pytest.fixture(scope="session")
def base_url(dashboard: Dashboard) -> str:
    return dashboard.url


@pytest.fixture(scope="session")
def artifacts() -> Path:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    return ARTIFACTS


@pytest.fixture
def console_errors(page: Page) -> list[str]:
    """Every console error and uncaught exception of the page, as text; a test asserts it is empty."""
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"console: {message.text} at {message.location}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    return errors


Shoot = Callable[[Page, str], None]


@pytest.fixture
def shoot(artifacts: Path) -> Shoot:
    """`shoot(page, name)` saves a full-page screenshot as test-artifacts/browser/<name>.png."""

    def save(page: Page, name: str) -> None:
        page.screenshot(path=str(artifacts / f"{name}.png"), full_page=True)

    return save
