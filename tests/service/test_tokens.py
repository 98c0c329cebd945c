"""Tokens (list, revoke, expiry; CLI and admin API), last-use stamps, caller-scoped idempotency,
and CSRF on cookie-authenticated changes, against a real `kvcanary serve` on SQLite."""

from __future__ import annotations

import time
from datetime import timedelta

import httpx
import pytest
from typer.testing import CliRunner

from service.auth import Role, create_token, lookup
from service.db.models import ApiToken, utcnow
from service.db.session import session_scope
from service.settings import get_settings
from tests.service.conftest import LiveService, bearer

PROFILE = "kimi-linear-48b-a3b"


@pytest.fixture(scope="module")
def service(idle_service: LiveService) -> LiveService:
    return idle_service


def _row(service: LiveService, name: str) -> ApiToken:
    with session_scope(service.database_url, write=False) as session:
        row = session.query(ApiToken).filter_by(name=name).one()
        session.expunge(row)
        return row


def test_admin_api_lists_creates_and_revokes_tokens(service: LiveService) -> None:
    admin = bearer(service.token(Role.ADMIN, "api-admin"))
    made = httpx.post(
        f"{service.url}/api/v1/tokens", json={"name": "matrix-ci", "role": "ci", "expires_in_days": 30}, headers=admin
    )
    assert made.status_code == 201, made.text
    created = made.json()
    expires = created["expires_at"]
    assert created["token"].startswith("kvc_") and expires is not None
    ci = bearer(created["token"])
    assert httpx.post(f"{service.url}/api/v1/runs", json={"profile": PROFILE}, headers=ci).status_code == 201

    listed = httpx.get(f"{service.url}/api/v1/tokens", headers=admin).json()
    mine = next(t for t in listed if t["id"] == created["id"])
    assert mine["name"] == "matrix-ci" and not mine["revoked"] and "token" not in mine
    assert httpx.get(f"{service.url}/api/v1/tokens", headers=ci).status_code == 403

    revoked = httpx.post(f"{service.url}/api/v1/tokens/{created['id']}/revoke", headers=admin)
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    refused = httpx.post(f"{service.url}/api/v1/runs", json={"profile": PROFILE}, headers=ci)
    assert refused.status_code == 401 and "revoked" in refused.text
    assert httpx.post(f"{service.url}/api/v1/tokens/999999/revoke", headers=admin).status_code == 404


def test_the_api_takes_a_lifetime_as_the_cli_writes_it(service: LiveService) -> None:
    """`expires_in` reads durations as `--expires-in` does (service.durations), naming a bad value."""
    admin = bearer(service.token(Role.ADMIN, "duration-admin"))
    url = f"{service.url}/api/v1/tokens"
    made = httpx.post(url, json={"name": "half-day", "role": "ci", "expires_in": "12h"}, headers=admin)
    assert made.status_code == 201, made.text
    expires_at = _row(service, "half-day").expires_at
    assert expires_at is not None and abs(expires_at - utcnow() - timedelta(hours=12)) < timedelta(minutes=5)
    bad = httpx.post(url, json={"name": "never", "role": "ci", "expires_in": "soon"}, headers=admin)
    assert bad.status_code == 422 and "expires_in 'soon' is not a duration" in bad.text, bad.text
    twice = {"name": "never", "role": "ci", "expires_in": "1d", "expires_in_days": 1}
    both = httpx.post(url, json=twice, headers=admin)
    assert both.status_code == 422 and "not both" in both.text, both.text


def test_an_expired_token_gets_401(service: LiveService) -> None:
    with session_scope(service.database_url) as session:
        expired = create_token(session, "old-ci", Role.CI, expires_at=utcnow() + timedelta(hours=1))
        live = create_token(session, "new-ci", Role.CI, expires_at=utcnow() + timedelta(hours=1))
        row = lookup(session, expired)
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)  # time passes: no token can be made expired
    trigger = {"profile": PROFILE}
    assert httpx.post(f"{service.url}/api/v1/runs", json=trigger, headers=bearer(expired)).status_code == 401
    assert httpx.post(f"{service.url}/api/v1/runs", json=trigger, headers=bearer(live)).status_code == 201


def test_cli_lists_and_revokes_tokens(service: LiveService, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cli import app

    monkeypatch.setenv("KVCANARY_DATA_DIR", str(service.data_dir))
    get_settings.cache_clear()
    runner = CliRunner()
    try:
        create = ["tokens", "create", "--role", "viewer", "--name", "reader-cli", "--expires-in", "7d"]
        made = runner.invoke(app, create)
        assert made.exit_code == 0, made.output
        secret = made.output.strip().splitlines()[-1]
        assert httpx.get(f"{service.url}/api/v1/runs", headers=bearer(secret)).status_code == 200
        listed = runner.invoke(app, ["tokens", "list"])
        line = next(row for row in listed.output.splitlines() if "\treader-cli\t" in row)
        assert "\tviewer\tactive\texpires " in line and secret not in listed.output
        revoked = runner.invoke(app, ["tokens", "revoke", line.split("\t")[0]])
        assert revoked.exit_code == 0, revoked.output
        assert httpx.get(f"{service.url}/api/v1/runs", headers=bearer(secret)).status_code == 401
        assert "\treader-cli\tviewer\trevoked\t" in runner.invoke(app, ["tokens", "list"]).output
        bad = runner.invoke(app, ["tokens", "create", "--role", "ci", "--expires-in", "soon"])
        assert bad.exit_code != 0 and "'soon' is not a duration" in bad.output and "90d" in bad.output
    finally:
        get_settings.cache_clear()


def test_reads_stamp_last_use_at_most_once_a_minute(service: LiveService) -> None:
    token = service.token(Role.VIEWER, "stamp-reader")
    assert httpx.get(f"{service.url}/api/v1/runs", headers=bearer(token)).status_code == 200
    deadline = time.monotonic() + 10
    while _row(service, "stamp-reader").last_used_at is None:
        assert time.monotonic() < deadline, "the first use was never recorded"
        time.sleep(0.05)
    first = _row(service, "stamp-reader").last_used_at
    for _ in range(5):
        assert httpx.get(f"{service.url}/api/v1/runs", headers=bearer(token)).status_code == 200
    assert _row(service, "stamp-reader").last_used_at == first


def test_idempotency_keys_belong_to_their_caller_and_their_request(service: LiveService) -> None:
    one, two = bearer(service.token(Role.CI, "ci-one")), bearer(service.token(Role.CI, "ci-two"))
    key = {"Idempotency-Key": "12345-1"}
    body = {"profile": PROFILE, "labels": {"git_sha": "abc"}}
    first = httpx.post(f"{service.url}/api/v1/runs", json=body, headers={**one, **key})
    again = httpx.post(f"{service.url}/api/v1/runs", json=body, headers={**one, **key})
    assert (first.status_code, again.status_code) == (201, 200) and first.json()["id"] == again.json()["id"]
    other = httpx.post(f"{service.url}/api/v1/runs", json=body, headers={**two, **key})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert other.json()["triggered_by"] == "ci-two"
    changed = httpx.post(
        f"{service.url}/api/v1/runs", json={**body, "labels": {"git_sha": "def"}}, headers={**one, **key}
    )
    assert changed.status_code == 409 and "labels" in changed.json()["detail"]
    assert f"run {first.json()['id']}" in changed.json()["detail"]
    whisper = httpx.post(f"{service.url}/api/v1/runs", json={"profile": "whisper-large-v3"}, headers={**one, **key})
    assert whisper.status_code == 409 and "profile" in whisper.json()["detail"]


def test_cookie_changes_need_the_pages_csrf_token(service: LiveService) -> None:
    admin = service.token(Role.ADMIN, "cookie-admin")
    change = {"profile": PROFILE, "suite": "gsm8k", "metric": "strict-match", "source": "csrf check"}
    with httpx.Client(base_url=service.url) as browser:
        assert browser.post("/login", data={"token": admin}).status_code == 303
        refused = browser.put("/api/v1/baselines", json=change)
        assert refused.status_code == 403 and "X-CSRF-Token" in refused.text
        page = browser.get(f"/profiles/{PROFILE}").text
        csrf = page.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
        assert len(csrf) == 64
        assert browser.put("/api/v1/baselines", json=change, headers={"X-CSRF-Token": "0" * 64}).status_code == 403
        assert browser.put("/api/v1/baselines", json=change, headers={"X-CSRF-Token": csrf}).status_code == 200
        assert browser.get("/api/v1/runs").status_code == 200  # reads need none
    # bearer clients are not browsers: no CSRF header needed
    assert httpx.put(f"{service.url}/api/v1/baselines", json=change, headers=bearer(admin)).status_code == 200
