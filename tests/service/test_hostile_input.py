"""Hostile but careful input against a real `kvcanary serve` on SQLite: every answer a 4xx that
says what was wrong, and nothing stored that later breaks a read for everyone.

One service serves the whole module (each test uses its own names, keys and tokens).
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.auth import Role
from service.db.migrate import upgrade
from tests.service.conftest import LiveService, bearer

PROFILE = "kimi-linear-48b-a3b"
TOO_BIG = 2**63


@pytest.fixture(scope="module")
def service(idle_service: LiveService) -> LiveService:
    return idle_service


JSON = {"Content-Type": "application/json"}


def as_written(template: str, number: str = "") -> str:
    """A body sent as written (json= would re-encode lone surrogates or refuse NaN)."""
    return template.replace("$P", PROFILE).replace("$N", number)


def test_lone_surrogates_and_nul_are_refused_and_lists_stay_readable(service: LiveService) -> None:
    ci = bearer(service.token(Role.CI))
    admin = bearer(service.token(Role.ADMIN))
    for body in (
        '{"profile": "$P", "labels": {"a": "x\\ud800"}}',
        '{"profile": "$P", "labels": {"a": "x\\u0000y"}}',
        '{"profile": "$P", "labels": {"a\\udfff": "x"}}',
    ):
        answer = httpx.post(f"{service.url}/api/v1/runs", content=as_written(body), headers={**ci, **JSON})
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["detail"][0]["loc"][0] == "body"
    schedule = as_written('{"name": "evil", "profile": "$P", "cron": "0 3 * * *", "labels": {"a": "\\ud800"}}')
    answer = httpx.put(f"{service.url}/api/v1/schedules", content=schedule, headers={**admin, **JSON})
    assert answer.status_code == 422, answer.text
    for path in ("/api/v1/runs", "/runs", "/api/v1/schedules"):
        assert httpx.get(service.url + path).status_code == 200, path


def test_ids_and_offsets_past_64_bits_are_refused(service: LiveService) -> None:
    ci, admin = bearer(service.token(Role.CI)), bearer(service.token(Role.ADMIN))
    for method, path, headers in (
        ("GET", f"/api/v1/runs/{TOO_BIG}", {}),
        ("GET", f"/api/v1/runs/{TOO_BIG}/samples", {}),
        ("POST", f"/api/v1/runs/{TOO_BIG}/cancel", ci),
        ("POST", f"/api/v1/runs/{TOO_BIG}/promote", admin),
        ("GET", f"/api/v1/runs/1/diff/{TOO_BIG}", {}),
        ("GET", f"/api/v1/runs?offset={TOO_BIG}", {}),
        ("GET", f"/api/v1/runs/1/samples?offset={TOO_BIG}", {}),
        ("GET", f"/runs/{TOO_BIG}", {}),
        ("GET", f"/runs/{TOO_BIG}/samples", {}),
        ("GET", f"/compare/1/{TOO_BIG}", {}),
        ("GET", f"/runs?offset={TOO_BIG}", {}),
    ):
        answer = httpx.request(method, service.url + path, headers=headers)
        assert answer.status_code in (404, 422), (path, answer.status_code, answer.text[:200])
    reference = {"profile": PROFILE, "suite": "gsm8k", "metric": "strict-match", "reference_run_id": TOO_BIG}
    assert httpx.put(f"{service.url}/api/v1/baselines", json=reference, headers=admin).status_code == 422


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e309", "99999999999999999999"])
def test_numbers_json_cannot_store_are_refused(service: LiveService, number: str) -> None:
    admin = bearer(service.token(Role.ADMIN))
    run = as_written('{"profile": "$P", "overrides": {"limit": $N}}', number)
    answer = httpx.post(f"{service.url}/api/v1/runs", content=run, headers={**admin, **JSON})
    assert answer.status_code == 422, answer.text
    change = as_written('{"profile": "$P", "suite": "gsm8k", "metric": "strict-match", "value": $N}', number)
    answer = httpx.put(f"{service.url}/api/v1/baselines", content=change, headers={**admin, **JSON})
    assert answer.status_code == 422, answer.text


def test_baseline_edits_refuse_null_unknown_metrics_and_wild_values(service: LiveService) -> None:
    admin = bearer(service.token(Role.ADMIN))
    base = {"profile": PROFILE, "suite": "gsm8k", "metric": "strict-match"}
    for change, words in (
        ({**base, "tolerance": None}, "cannot be null"),
        ({**base, "source": None}, "cannot be null"),
        ({**base, "metric": "made-up", "value": 0.5}, "reports no metric"),
        ({**base, "value": -5}, "greater than or equal"),
        ({**base, "value": 1e308}, "less than or equal"),
        ({**base, "tolerance": 1e308}, "less than or equal"),
    ):
        answer = httpx.put(f"{service.url}/api/v1/baselines", json=change, headers=admin)
        assert answer.status_code == 422 and words in answer.text, (change, answer.text)
    listed = httpx.get(f"{service.url}/api/v1/baselines", params={"profile": PROFILE}).json()
    assert {b["metric"] for b in listed} <= {"strict-match", "flexible-extract"}


def test_schedules_that_never_fire_or_have_no_zone_are_refused(service: LiveService) -> None:
    admin = bearer(service.token(Role.ADMIN))
    for change, words in (
        ({"name": "feb-30", "profile": PROFILE, "cron": "0 0 30 2 *", "enabled": True}, "never fires"),
        ({"name": "no-zone", "profile": PROFILE, "cron": "0 3 * * *", "timezone": "", "enabled": True}, "time zone"),
    ):
        answer = httpx.put(f"{service.url}/api/v1/schedules", json=change, headers=admin)
        assert answer.status_code == 422 and words in answer.text, answer.text
    assert httpx.get(f"{service.url}/api/v1/schedules").status_code == 200


def test_label_filters_are_bounded_and_checked(service: LiveService) -> None:
    assert httpx.get(f"{service.url}/api/v1/runs?label=a%00b=1").status_code == 422
    assert httpx.get(f"{service.url}/api/v1/runs", params={"label": "Bad Key=1"}).status_code == 422
    assert httpx.get(f"{service.url}/api/v1/runs", params={"label": "no-equals-sign"}).status_code == 422
    many = [("label", f"k{i}=v") for i in range(1001)]
    assert httpx.get(f"{service.url}/api/v1/runs", params=many).status_code == 422
    assert httpx.get(f"{service.url}/runs?label=a%00b%3D1").status_code == 422
    assert httpx.get(f"{service.url}/api/v1/runs", params={"label": "git_sha=abc"}).status_code == 200


def test_chunked_body_over_the_limit_gets_413(service: LiveService) -> None:
    ci = bearer(service.token(Role.CI))

    def chunks() -> Iterator[bytes]:
        yield b'{"profile": "%s", "labels": {"note": "' % PROFILE.encode()
        for _ in range(80):
            yield b"x" * 1024
        yield b'"}}'

    answer = httpx.post(
        f"{service.url}/api/v1/runs", content=chunks(), headers={**ci, "Content-Type": "application/json"}
    )
    assert answer.status_code == 413, answer.text


def test_database_and_folders_are_private(service: LiveService, tmp_path: Path) -> None:
    assert stat.S_IMODE((service.data_dir / "kvcanary.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((service.data_dir / "runs").stat().st_mode) == 0o700
    fresh = tmp_path / "fresh" / "kvcanary.db"
    upgrade(f"sqlite:///{fresh}")
    assert stat.S_IMODE(fresh.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_openapi_documents_errors_as_they_are_sent(service: LiveService) -> None:
    spec = httpx.get(f"{service.url}/openapi.json").json()
    create = spec["paths"]["/api/v1/runs"]["post"]["responses"]
    assert {"201", "200", "401", "403", "404", "409", "413", "422", "503"} <= set(create)
    assert "Retry-After" in create["503"]["headers"]
    assert {"401", "403", "404", "422"} <= set(spec["paths"]["/api/v1/runs/{run_id}/cancel"]["post"]["responses"])
    # the service's own 422s carry one sentence; the schema says so beside FastAPI's list
    detail = spec["components"]["schemas"]["Unprocessable"]["properties"]["detail"]
    assert {"string", "array"} == {option.get("type") for option in detail["anyOf"]}
