"""The HTTP API against a real `kvcanary serve` on a real SQLite file (worker off: runs stay queued)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from service.auth import Role
from tests.service.conftest import LiveService, StartService

PROFILE = "kimi-linear-48b-a3b"


@pytest.fixture
def service(start_service: StartService) -> LiveService:
    return start_service()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_auth_matrix(service: LiveService) -> None:
    tokens = {role: service.token(role) for role in Role}
    cases = [
        ("POST", "/api/v1/runs", {"profile": PROFILE}),
        ("PUT", "/api/v1/baselines", {"profile": PROFILE, "suite": "gsm8k", "metric": "strict-match", "value": 0.8}),
    ]
    expected = {
        "/api/v1/runs": {None: 401, "bogus": 401, Role.VIEWER: 403, Role.CI: 201, Role.ADMIN: 201},
        "/api/v1/baselines": {None: 401, "bogus": 401, Role.VIEWER: 403, Role.CI: 403, Role.ADMIN: 200},
    }
    for method, path, body in cases:
        for who, status in expected[path].items():
            headers = {} if who is None else bearer("kvc_bogus" if who == "bogus" else tokens[who])  # type: ignore[index]
            response = httpx.request(method, service.url + path, json=body, headers=headers)
            assert response.status_code == status, (method, path, who, response.text)
    # reads are open by default
    assert httpx.get(f"{service.url}/api/v1/runs").status_code == 200


def test_reads_need_a_token_when_configured(start_service: StartService) -> None:
    service = start_service(KVCANARY_READ_AUTH="true")
    viewer = service.token(Role.VIEWER)
    assert httpx.get(f"{service.url}/api/v1/runs").status_code == 401
    assert httpx.get(f"{service.url}/api/v1/runs", headers=bearer(viewer)).status_code == 200
    with httpx.Client(base_url=service.url) as browser:
        assert browser.post("/login", data={"token": viewer}).status_code == 303
        assert browser.get("/api/v1/runs").status_code == 200  # the dashboard's session cookie


def test_fifty_concurrent_posts_with_one_idempotency_key_make_one_run(service: LiveService) -> None:
    token = service.token(Role.CI)

    async def post_all() -> list[httpx.Response]:
        headers = {**bearer(token), "Idempotency-Key": "build-4711"}
        async with httpx.AsyncClient(base_url=service.url, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/api/v1/runs", json={"profile": PROFILE, "labels": {"git_sha": "abc"}}, headers=headers
                    )
                    for _ in range(50)
                )
            )

    responses = asyncio.run(post_all())
    assert all(r.status_code in (200, 201) for r in responses), {r.status_code for r in responses}
    assert sum(r.status_code == 201 for r in responses) == 1
    assert len({r.json()["id"] for r in responses}) == 1
    listing = httpx.get(f"{service.url}/api/v1/runs").json()
    assert listing["total"] == 1


def test_bad_input_is_named(service: LiveService) -> None:
    headers = bearer(service.token(Role.CI))
    unknown = httpx.post(f"{service.url}/api/v1/runs", json={"profile": "no-such-model"}, headers=headers)
    assert unknown.status_code == 404
    assert PROFILE in unknown.json()["detail"] and "whisper-large-v3" in unknown.json()["detail"]

    invalid = httpx.post(
        f"{service.url}/api/v1/runs", json={"profile": PROFILE, "overrides": {"limit": -3}}, headers=headers
    )
    assert invalid.status_code == 422
    assert any(err["loc"][-1] == "limit" for err in invalid.json()["detail"])

    not_allowed = httpx.post(
        f"{service.url}/api/v1/runs",
        json={"profile": PROFILE, "overrides": {"extra_args": ["--evil"]}},
        headers=headers,
    )
    assert not_allowed.status_code == 422
    assert any("extra_args" in str(err["loc"]) for err in not_allowed.json()["detail"])

    bad_label = httpx.post(
        f"{service.url}/api/v1/runs", json={"profile": PROFILE, "labels": {"Bad Key!": "x"}}, headers=headers
    )
    assert bad_label.status_code == 422 and "label key" in bad_label.text

    huge = httpx.post(
        f"{service.url}/api/v1/runs",
        json={"profile": PROFILE, "labels": {"note": "x" * 70_000}},
        headers=headers,
    )
    assert huge.status_code == 413


def test_run_listing_filters_and_cancel(service: LiveService) -> None:
    headers = bearer(service.token(Role.CI))
    ids = []
    for i in range(5):
        labels = {"git_sha": f"sha{i}", "vllm_version": "0.24.0" if i % 2 else "0.25.1"}
        body = {"profile": PROFILE if i < 3 else "whisper-large-v3", "labels": labels}
        ids.append(httpx.post(f"{service.url}/api/v1/runs", json=body, headers=headers).json()["id"])

    page = httpx.get(f"{service.url}/api/v1/runs", params={"limit": 2}).json()
    assert page["total"] == 5 and [r["id"] for r in page["items"]] == ids[::-1][:2]
    page2 = httpx.get(f"{service.url}/api/v1/runs", params={"limit": 2, "offset": 4}).json()
    assert [r["id"] for r in page2["items"]] == [ids[0]]
    by_profile = httpx.get(f"{service.url}/api/v1/runs", params={"profile": "whisper-large-v3"}).json()
    assert sorted(r["id"] for r in by_profile["items"]) == ids[3:]
    by_label = httpx.get(f"{service.url}/api/v1/runs", params={"label": "vllm_version=0.24.0"}).json()
    assert sorted(r["id"] for r in by_label["items"]) == [ids[1], ids[3]]
    assert httpx.get(f"{service.url}/api/v1/runs", params={"trigger": "nightly"}).json()["total"] == 0

    cancelled = httpx.post(f"{service.url}/api/v1/runs/{ids[0]}/cancel", headers=headers).json()
    assert cancelled["status"] == "cancelled"
    queued = httpx.get(f"{service.url}/api/v1/runs", params={"status": "queued"}).json()
    assert ids[0] not in [r["id"] for r in queued["items"]] and queued["total"] == 4

    detail = httpx.get(f"{service.url}/api/v1/runs/{ids[1]}").json()
    assert detail["progress"] == {"done": 0, "total": 0, "phase": "", "eta_s": None}
    assert detail["labels"]["git_sha"] == "sha1" and detail["links"]["dashboard"].endswith(f"/runs/{ids[1]}")
    assert httpx.get(f"{service.url}/api/v1/runs/999999").status_code == 404
    assert httpx.get(f"{service.url}/api/v1/runs/{ids[1]}/samples").json()["total"] == 0


def test_profiles_baselines_history_health_and_metrics(service: LiveService) -> None:
    profiles = {p["name"]: p for p in httpx.get(f"{service.url}/api/v1/profiles").json()}
    assert profiles[PROFILE]["attention_backend"] == "TRITON_MLA"
    assert profiles["whisper-large-v3"]["suites"] == ["wer"]

    baselines = httpx.get(f"{service.url}/api/v1/baselines", params={"profile": PROFILE}).json()
    strict = next(b for b in baselines if b["metric"] == "strict-match")
    assert strict["value"] == pytest.approx(0.8711) and "47671" in strict["source"]

    admin = bearer(service.token(Role.ADMIN, "release-manager"))
    change = {"profile": PROFILE, "suite": "gsm8k", "metric": "strict-match", "value": 0.87, "source": "re-measured"}
    updated = httpx.put(f"{service.url}/api/v1/baselines", json=change, headers=admin)
    assert updated.status_code == 200 and updated.json()["updated_by"] == "release-manager"
    history = httpx.get(f"{service.url}/api/v1/baselines/history", params={"profile": PROFILE}).json()
    assert history[0]["before"]["value"] == pytest.approx(0.8711) and history[0]["after"]["value"] == 0.87
    wrong_suite = {**change, "suite": "wer"}
    assert httpx.put(f"{service.url}/api/v1/baselines", json=wrong_suite, headers=admin).status_code == 422

    assert httpx.get(f"{service.url}/healthz").json() == {"status": "ok"}
    httpx.post(f"{service.url}/api/v1/runs", json={"profile": PROFILE}, headers=bearer(service.token(Role.CI)))
    metrics = httpx.get(f"{service.url}/metrics").text
    assert 'kvcanary_runs{status="queued"} 1.0' in metrics
    assert "kvcanary_queue_length 1.0" in metrics


def test_openapi_documents_every_endpoint_with_examples(service: LiveService) -> None:
    spec = httpx.get(f"{service.url}/openapi.json").json()
    paths = spec["paths"]
    for path in (
        "/api/v1/runs",
        "/api/v1/runs/{run_id}",
        "/api/v1/runs/{run_id}/samples",
        "/api/v1/runs/{run_id}/cancel",
        "/api/v1/profiles",
        "/api/v1/baselines",
        "/healthz",
        "/metrics",
    ):
        assert path in paths, path
    assert spec["components"]["schemas"]["RunCreate"]["examples"][0]["profile"] == PROFILE
