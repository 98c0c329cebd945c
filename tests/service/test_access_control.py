"""Who may do what, beyond roles: cancelling others' runs, dashboard sessions, token rules,
`/metrics` behind read auth, security headers, offline API docs and what the access log keeps.

One real `kvcanary serve` (worker off, reads behind tokens) serves the module.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from service.auth import Role
from service.db.migrate import upgrade
from service.db.session import session_scope
from service.settings import get_settings
from tests.conftest import OFFLINE_ENV
from tests.service.conftest import LiveService, bearer

PROFILE = "kimi-linear-48b-a3b"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    folder = tmp_path_factory.mktemp("access") / "data"
    folder.mkdir()
    env = {
        **os.environ,
        **OFFLINE_ENV,
        "KVCANARY_DATA_DIR": str(folder),
        "KVCANARY_START_WORKER": "false",
        "KVCANARY_READ_AUTH": "true",
    }
    live = LiveService(folder, env)
    live.start()
    yield live
    live.stop()


def _trigger(service: LiveService, token: str) -> int:
    made = httpx.post(f"{service.url}/api/v1/runs", json={"profile": PROFILE}, headers=bearer(token))
    assert made.status_code == 201, made.text
    run_id: int = made.json()["id"]
    return run_id


def test_a_ci_token_cancels_only_its_own_runs_and_an_admin_any(service: LiveService) -> None:
    mine, theirs, admin = service.token(Role.CI), service.token(Role.CI, "other-pipeline"), service.token(Role.ADMIN)
    own, other, for_admin = _trigger(service, mine), _trigger(service, theirs), _trigger(service, theirs)
    refused = httpx.post(f"{service.url}/api/v1/runs/{other}/cancel", headers=bearer(mine))
    assert refused.status_code == 403, refused.text
    assert "other-pipeline" in refused.json()["detail"] and "admin" in refused.json()["detail"]
    assert httpx.get(f"{service.url}/api/v1/runs/{other}", headers=bearer(mine)).json()["status"] == "queued"
    cancelled = httpx.post(f"{service.url}/api/v1/runs/{own}/cancel", headers=bearer(mine))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    by_admin = httpx.post(f"{service.url}/api/v1/runs/{for_admin}/cancel", headers=bearer(admin))
    assert by_admin.status_code == 200 and by_admin.json()["status"] == "cancelled"


@contextmanager
def _login(service: LiveService, token: str) -> Iterator[httpx.Client]:
    """A client holding the session cookie a login gives, as a browser would."""
    with httpx.Client(base_url=service.url) as browser:
        assert browser.post("/login", data={"token": token, "next": "/runs"}).status_code == 303
        yield browser


def test_logout_and_revocation_end_a_dashboard_session(service: LiveService) -> None:
    admin = service.token(Role.ADMIN)
    viewer = service.token(Role.VIEWER, "session-reader")
    with _login(service, viewer) as browser:
        cookie = browser.cookies["kvcanary_session"]
        assert viewer not in cookie and len(cookie) >= 40  # a random session id, not the token
        with session_scope(service.database_url, write=False) as session:
            stored = session.execute(text("SELECT secret_hash, expires_at FROM dashboard_sessions")).all()
        assert cookie not in {row[0] for row in stored}  # only its hash is kept
        assert browser.get("/runs").status_code == 200
        assert browser.post("/logout").status_code == 303
    copied = httpx.get(f"{service.url}/api/v1/runs", cookies={"kvcanary_session": cookie})
    assert copied.status_code == 401 and "log in again" in copied.json()["detail"]
    page = httpx.get(f"{service.url}/runs", cookies={"kvcanary_session": cookie})
    assert page.status_code == 303 and page.headers["location"].startswith("/login")

    with _login(service, viewer) as browser:
        assert browser.get("/api/v1/runs").status_code == 200
        token_id = next(
            t["id"]
            for t in httpx.get(f"{service.url}/api/v1/tokens", headers=bearer(admin)).json()
            if t["name"] == "session-reader"
        )
        assert httpx.post(f"{service.url}/api/v1/tokens/{token_id}/revoke", headers=bearer(admin)).status_code == 200
        assert browser.get("/api/v1/runs").status_code == 401


@pytest.mark.parametrize("stored_role", ["superuser", ""])
def test_a_token_whose_role_no_longer_exists_is_no_role(service: LiveService, stored_role: str) -> None:
    """A role renamed or emptied in the database: 401 on the API (it was 500) and no dashboard
    login, and a session started before the change ends with it."""
    name = f"renamed-{stored_role or 'empty'}"
    token = service.token(Role.CI, name)
    with _login(service, token) as browser:
        with session_scope(service.database_url) as session:
            session.execute(
                text("UPDATE api_tokens SET role = :role WHERE name = :name"), {"role": stored_role, "name": name}
            )
        assert browser.get("/api/v1/runs").status_code == 401
        assert browser.get("/runs").status_code == 303
    for call in (
        httpx.get(f"{service.url}/api/v1/runs", headers=bearer(token)),
        httpx.post(f"{service.url}/api/v1/runs", json={"profile": PROFILE}, headers=bearer(token)),
    ):
        assert call.status_code == 401, call.text
        assert "role this service does not know" in call.json()["detail"]
    login = httpx.post(f"{service.url}/login", data={"token": token, "next": "/runs"})
    assert login.status_code == 401 and "kvcanary_session" not in login.cookies


def test_a_raw_token_in_the_cookie_is_not_a_session(service: LiveService) -> None:
    viewer = service.token(Role.VIEWER)
    for name in ("kvcanary_session", "kvcanary_token"):
        assert httpx.get(f"{service.url}/api/v1/runs", cookies={name: viewer}).status_code == 401


def test_tokens_need_a_future_expiry_and_a_unique_name(service: LiveService) -> None:
    admin = bearer(service.token(Role.ADMIN))
    made = httpx.post(f"{service.url}/api/v1/tokens", json={"name": "nightly-ci", "role": "ci"}, headers=admin)
    assert made.status_code == 201, made.text
    again = httpx.post(f"{service.url}/api/v1/tokens", json={"name": "nightly-ci", "role": "viewer"}, headers=admin)
    assert again.status_code == 409 and "nightly-ci" in again.json()["detail"] and "unique" in again.json()["detail"]
    past = httpx.post(
        f"{service.url}/api/v1/tokens", json={"name": "past", "role": "ci", "expires_in_days": 0}, headers=admin
    )
    assert past.status_code == 422


def test_cli_refuses_a_past_expiry_and_a_taken_name(service: LiveService, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cli import app

    monkeypatch.setenv("KVCANARY_DATA_DIR", str(service.data_dir))
    get_settings.cache_clear()
    runner = CliRunner()
    try:
        yesterday = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")
        past = runner.invoke(app, ["tokens", "create", "--role", "ci", "--name", "late", "--expires", yesterday])
        assert past.exit_code != 0 and "already passed" in past.output, past.output
        first = runner.invoke(app, ["tokens", "create", "--role", "ci", "--name", "cli-ci"])
        assert first.exit_code == 0, first.output
        taken = runner.invoke(app, ["tokens", "create", "--role", "viewer", "--name", "cli-ci"])
        assert taken.exit_code != 0 and "'cli-ci' exists" in taken.output, taken.output
        unnamed = [runner.invoke(app, ["tokens", "create", "--role", "viewer"]) for _ in range(2)]
        assert all(made.exit_code == 0 for made in unnamed)  # the default names differ
        listed = runner.invoke(app, ["tokens", "list"]).output
        assert "\tlate\t" not in listed and listed.count("\tcli-ci\t") == 1
    finally:
        get_settings.cache_clear()


def test_the_migration_renames_duplicate_token_names_and_keeps_run_owners(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kvcanary.db'}"
    upgrade(url, "0005")
    now = datetime.now(UTC).isoformat(" ")
    with session_scope(url) as session:
        for token_id, name in ((1, "ci"), (2, "ci"), (3, "nightly")):
            session.execute(
                text(
                    "INSERT INTO api_tokens (id, name, role, token_hash, created_at, revoked) "
                    "VALUES (:id, :name, 'ci', :hash, :now, 0)"
                ),
                {"id": token_id, "name": name, "hash": f"{token_id:064d}", "now": now},
            )
        for run_id, by in ((1, "ci"), (2, "nightly")):
            session.execute(
                text(
                    "INSERT INTO runs (id, profile, status, trigger, triggered_by, labels, overrides, variants, "
                    "attempt, max_attempts, cancel_requested, created_at, progress_done, progress_total, "
                    "progress_phase, verdict_summary, error, engine, timings, log_tail, run_dir) VALUES "
                    "(:id, 'p', 'queued', 'api', :by, '{}', '{}', '[]', 0, 1, 0, :now, 0, 0, '', '', '', '{}', "
                    "'{}', '', '')"
                ),
                {"id": run_id, "by": by, "now": now},
            )
    upgrade(url)
    with session_scope(url, write=False) as session:
        names = dict(session.execute(text("SELECT id, name FROM api_tokens")).all())
        owners = dict(session.execute(text("SELECT id, triggered_by_token_id FROM runs")).all())
    assert names == {1: "ci", 2: "ci-2", 3: "nightly"}
    assert owners == {1: None, 2: 3}  # "ci" named two tokens: that run is left to admins


def test_metrics_need_a_token_when_reads_do(service: LiveService) -> None:
    assert httpx.get(f"{service.url}/metrics").status_code == 401
    scraped = httpx.get(f"{service.url}/metrics", headers=bearer(service.token(Role.VIEWER)))
    assert scraped.status_code == 200 and "kvcanary_queue_length" in scraped.text


def test_every_response_carries_the_security_headers(service: LiveService) -> None:
    viewer = bearer(service.token(Role.VIEWER))
    for path, headers in [
        ("/login", {}),
        ("/runs", viewer),  # a 303 to the login form: no bearer header on pages
        ("/api/v1/runs", viewer),
        ("/api/v1/runs", {}),  # a 401
        ("/healthz", {}),
        ("/static/dashboard.css", {}),
        ("/docs", {}),
        ("/redoc", {}),
    ]:
        response = httpx.get(service.url + path, headers=headers)
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert response.headers["x-frame-options"] == "DENY", path
        assert response.headers["referrer-policy"] == "no-referrer", path
        directives = (part.strip().partition(" ") for part in response.headers["content-security-policy"].split(";"))
        policy = {name: value for name, _, value in directives}
        assert policy["frame-ancestors"] == "'none'" and policy["script-src"] == "'self'", (path, policy)
        assert policy["object-src"] == "'none'" and policy["base-uri"] == "'none'", path
        assert "unsafe" not in policy["script-src"], path  # inline styles are allowed, inline scripts never


def test_api_docs_load_only_files_this_service_serves(service: LiveService) -> None:
    """An offline host has no CDN: every script and stylesheet of /docs and /redoc is local and loads."""
    for page in ("/docs", "/redoc"):
        html = httpx.get(service.url + page)
        assert html.status_code == 200
        urls = re.findall(r'(?:src|href|spec-url)="([^"]+)"', html.text)
        assert urls and all(url.startswith("/") and not url.startswith("//") for url in urls), urls
        assert "<script>" not in html.text  # no inline script: the CSP forbids it
        for url in urls:
            asset = httpx.get(service.url + url)
            assert asset.status_code == 200 and len(asset.content) > 100, url
    bundle = httpx.get(f"{service.url}/docs-assets/swagger-ui-bundle.js")
    assert "SwaggerUIBundle" in bundle.text and bundle.headers["content-type"].startswith("text/javascript")
    redoc = httpx.get(f"{service.url}/docs-assets/redoc.standalone.js").text
    assert "Redoc" in redoc and "cdn.redoc.ly" not in redoc  # its one off-site image is left out


def test_the_access_log_keeps_no_query_strings(service: LiveService) -> None:
    viewer = bearer(service.token(Role.VIEWER))
    asked = httpx.get(
        f"{service.url}/api/v1/runs", params={"label": "ticket=s3cr3t-in-a-url", "limit": 3}, headers=viewer
    )
    assert asked.status_code == 200
    deadline = time.monotonic() + 10
    while "GET /api/v1/runs?[redacted]" not in service.log_tail() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = (service.data_dir / "serve.log").read_text(errors="replace")
    assert "GET /api/v1/runs?[redacted]" in log and "s3cr3t-in-a-url" not in log
