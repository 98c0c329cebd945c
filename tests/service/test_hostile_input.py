"""Hostile but careful input against a real `kvcanary serve` on SQLite: every answer a 4xx that
says what was wrong, and nothing stored that later breaks a read for everyone.

One service serves the whole module (each test uses its own names, keys and tokens).
"""

from __future__ import annotations

import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import select, text

from service.auth import Role
from service.db.migrate import upgrade
from service.db.models import AlertCheck, AuditEvent, Baseline, Run, RunEvent, Sample, SuiteResult
from service.db.session import session_scope
from service.profiles import BaselineSpec, ScheduleSpec
from service.runs import queue, removal
from service.scheduling.schemas import ScheduleUpdate
from service.schemas import BaselineUpdate
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


TINY = "gsm8k-tiny-cpu"  # fixture:gsm8k-tiny, whose config.json says max_position_embeddings 1024
DIGITS_31, DIGITS_25 = "9" * 31, "9" * 25
# (profile, arms, words the 422 must hold: the value, the bound, where the bound came from)
ABSURD_ARMS = [
    (PROFILE, [f"fixed,max_num_batched_tokens={DIGITS_31},max_model_len={DIGITS_25}"], [DIGITS_31[:19], "64-bit"]),
    (
        PROFILE,
        [{"variant": "fixed", "engine": {"max_model_len": 2**63 - 1}}],
        ["9223372036854775807", "16777216", "kvcanary's ceiling"],
    ),
    (PROFILE, ["fixed,max_num_batched_tokens=1000000000000"], ["1000000000000", "16777216", "kvcanary's ceiling"]),
    (PROFILE, ["stock,kv_cache_dtype=bogus"], ["kv_cache_dtype=bogus", "fp8_e4m3", "CacheDType"]),
    (PROFILE, ["fixed,block_size=4096,max_model_len=16"], ["block_size=4096", "above 16", "max_model_len"]),
    (
        TINY,
        ["fixed,max_model_len=4096"],
        ["max_model_len=4096", "above 1024", "max_position_embeddings in", "config.json"],
    ),
    (TINY, ["fixed,max_model_len=1_024"], ["valid integer"]),
    (TINY, ["fixed,enforce_eager=1"], ["valid boolean"]),
]


@pytest.mark.parametrize(("profile", "arms", "words"), ABSURD_ARMS)
def test_engine_arguments_past_the_model_and_vllm_are_refused_at_the_door(
    service: LiveService, profile: str, arms: list[object], words: list[str]
) -> None:
    """These were queued with 201 and failed minutes later at engine start, on a GPU host taken for them."""
    ci = bearer(service.token(Role.CI))
    answer = httpx.post(
        f"{service.url}/api/v1/runs", json={"profile": profile, "compare": ["stock", *arms]}, headers=ci
    )
    assert answer.status_code == 422, answer.text
    assert all(word in answer.text for word in words), (words, answer.text)


def test_canaries_are_kept_once_however_often_they_are_sent(service: LiveService) -> None:
    ci = bearer(service.token(Role.CI))
    body = {"profile": PROFILE, "overrides": {"canaries": ["nan_kv_tail"] * 3000 + ["high_block_ids"]}}
    made = httpx.post(f"{service.url}/api/v1/runs", json=body, headers=ci)
    assert made.status_code == 201, made.text
    assert made.json()["overrides"]["canaries"] == ["nan_kv_tail", "high_block_ids"]
    assert made.json()["profile_snapshot"]["kernels"]["canaries"] == ["nan_kv_tail", "high_block_ids"]


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


# The request gate reads each body once, with the bytes and the one Content-Type FastAPI parses.

SURROGATE_LABEL = '{"profile": "$P", "labels": {"hostile": "x\\ud800"}}'


def _hostile_runs(service: LiveService) -> list[dict[str, object]]:
    runs = httpx.get(f"{service.url}/api/v1/runs", params={"limit": 500})
    assert runs.status_code == 200, runs.text
    return [run for run in runs.json()["items"] if "hostile" in run["labels"]]


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_json_in_utf16_or_utf32_without_bom_is_refused(service: LiveService, encoding: str) -> None:
    ci, admin = bearer(service.token(Role.CI)), bearer(service.token(Role.ADMIN))
    body = as_written(SURROGATE_LABEL).encode(encoding)
    answer = httpx.post(f"{service.url}/api/v1/runs", content=body, headers={**ci, **JSON})
    assert answer.status_code == 415 and "UTF-8" in answer.text, answer.text
    schedule = as_written('{"name": "evil", "profile": "$P", "cron": "0 3 * * *", "labels": {"a": "x\\ud800"}}')
    answer = httpx.put(f"{service.url}/api/v1/schedules", content=schedule.encode(encoding), headers={**admin, **JSON})
    assert answer.status_code == 415, answer.text
    assert _hostile_runs(service) == []
    for path in ("/api/v1/schedules", "/runs"):
        assert httpx.get(service.url + path).status_code == 200, path


def test_a_body_needs_exactly_one_json_content_type(service: LiveService) -> None:
    ci = bearer(service.token(Role.CI))
    body = as_written(SURROGATE_LABEL).encode()
    for types in (["application/json", "text/plain"], ["text/plain", "application/json"], []):
        headers = [*ci.items(), *(("Content-Type", value) for value in types)]
        answer = httpx.post(f"{service.url}/api/v1/runs", content=body, headers=headers)
        assert answer.status_code == 415 and "exactly one Content-Type" in answer.text, (types, answer.text)
    for content_type, body, status in (
        ("text/plain", b"\xff\xfe not UTF-8", 415),  # FastAPI's validation-error handler used to fail on it: 500
        ("application/json; charset=utf-16", b'{"profile": "x"}', 415),
        ("application/json", b'\xef\xbb\xbf{"profile": "x"}', 415),  # a byte order mark
        ("application/json", b'{"profile": ', 422),
        ("application/x-www-form-urlencoded", b"profile=x", 415),  # forms only outside the API
    ):
        answer = httpx.post(f"{service.url}/api/v1/runs", content=body, headers={**ci, "Content-Type": content_type})
        assert answer.status_code == status, (content_type, body, answer.text)
        assert answer.json()["detail"][0]["msg"], answer.text
    assert _hostile_runs(service) == []
    assert httpx.get(f"{service.url}/runs").status_code == 200


def test_deep_nesting_is_refused_only_where_a_body_is_read(service: LiveService) -> None:
    """2 KB of nested arrays used to raise RecursionError in the gate on every route, /healthz
    included: a 500 and a long traceback per request. A route that reads no body ignores it."""
    deep = {"Content-Type": "application/json"}
    body = "[" * 1000 + "]" * 1000
    log = service.data_dir / "serve.log"
    logged = log.stat().st_size
    assert httpx.request("GET", f"{service.url}/healthz", content=body, headers=deep).status_code == 200
    assert httpx.request("GET", f"{service.url}/login", content=body, headers=deep).status_code == 200
    assert httpx.request("GET", f"{service.url}/api/v1/runs", content=body, headers=deep).status_code == 200
    for method, path, headers in (
        ("POST", "/login", deep),
        ("POST", "/api/v1/runs", deep),
        ("POST", "/api/v1/runs", {**deep, **bearer(service.token(Role.CI))}),
    ):
        answer = httpx.request(method, service.url + path, content=body, headers=headers)
        assert answer.status_code == 422 and "deeper than 32 levels" in answer.text, (path, answer.text)
    shallow = as_written('{"profile": "$P", "labels": {"hostile": "ok"}, "overrides": {"limit": [[[[1]]]]}}')
    answer = httpx.post(
        f"{service.url}/api/v1/runs", content=shallow, headers={**deep, **bearer(service.token(Role.CI))}
    )
    assert answer.status_code == 422 and "deeper" not in answer.text, answer.text  # the schema's own 422
    assert "Traceback" not in log.read_bytes()[logged:].decode(errors="replace")


def test_paths_and_queries_that_are_not_utf8_are_refused(service: LiveService) -> None:
    for path in ("/api/v1/runs?label=a%ED%A0%80%3D1", "/runs?label=a%FF%3D1", "/api/v1/runs?profile=%C0%80"):
        answer = httpx.get(service.url + path)
        assert answer.status_code == 422 and "not UTF-8" in answer.text, (path, answer.text)
    assert httpx.get(f"{service.url}/api/v1/runs?label=git_sha%3D%C3%A9").status_code == 200


def test_login_form_still_posts(service: LiveService) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    answer = httpx.post(f"{service.url}/login", content=b"token=nope&next=%2Fruns", headers=form)
    assert answer.status_code == 401 and "unknown or revoked" in answer.text
    answer = httpx.post(f"{service.url}/login", content=b"token=%FF&next=%2Fruns", headers=form)
    assert answer.status_code == 422 and "not UTF-8" in answer.text, answer.text


# Defence in depth: a string stored before the gate refused it is shown escaped, and an admin
# can delete the run that holds it.


def _stored_run(service: LiveService, labels: dict[str, str], *, ended: bool = True) -> int:
    """A run written straight to the database: the API now refuses these labels, yet a database
    filled by an older version may hold them."""
    with session_scope(service.database_url) as session:
        run, _ = queue.enqueue(
            session,
            profile=PROFILE,
            trigger="ci",
            triggered_by="older-version",
            labels=labels,
            overrides={},
            arms=[],
            max_attempts=1,
        )
        session.flush()
        if ended:
            queue.request_cancel(session, run, "test")
        return run.id


def test_a_stored_lone_surrogate_is_shown_escaped_and_an_admin_deletes_the_run(service: LiveService) -> None:
    run_id = _stored_run(service, {"hostile": "x\ud800y"})
    folder = service.data_dir / "runs" / str(run_id)
    folder.mkdir(parents=True)
    (folder / "engine.log").write_text("log")
    with session_scope(service.database_url) as session:
        row = session.get(Run, run_id)
        assert row is not None
        row.run_dir = str(folder)
        # bytes that are not UTF-8 in a TEXT column, as another tool could write them
        session.execute(text("UPDATE runs SET error = CAST(X'6f6bff' AS TEXT) WHERE id = :id"), {"id": run_id})
    listed = httpx.get(f"{service.url}/api/v1/runs", params={"limit": 500})
    assert listed.status_code == 200, listed.text
    assert {"hostile": "x\\ud800y"} in [run["labels"] for run in listed.json()["items"]]
    detail = httpx.get(f"{service.url}/api/v1/runs/{run_id}").json()
    assert (detail["labels"], detail["error"]) == ({"hostile": "x\\ud800y"}, "ok\\xff")
    for page in ("/runs", f"/runs/{run_id}"):
        answer = httpx.get(service.url + page)
        assert answer.status_code == 200 and "x\\ud800y" in answer.text, page

    ci, admin = bearer(service.token(Role.CI)), bearer(service.token(Role.ADMIN, "repairer"))
    assert httpx.delete(f"{service.url}/api/v1/runs/{run_id}", headers=ci).status_code == 403
    assert httpx.delete(f"{service.url}/api/v1/runs/{run_id}").status_code == 401
    assert httpx.delete(f"{service.url}/api/v1/runs/{run_id}", headers=admin).status_code == 204
    assert httpx.get(f"{service.url}/api/v1/runs/{run_id}").status_code == 404
    assert httpx.delete(f"{service.url}/api/v1/runs/{run_id}", headers=admin).status_code == 404
    assert not folder.exists()
    with session_scope(service.database_url, write=False) as session:
        event = session.scalars(select(AuditEvent).where(AuditEvent.target == f"run {run_id}")).one()
        assert (event.actor, event.action) == ("token repairer", "run.delete")
        assert event.detail["labels"] == {"hostile": "x\\ud800y"} and event.detail["status"] == "cancelled"


def test_a_run_that_has_not_ended_or_is_a_reference_is_not_deleted(service: LiveService) -> None:
    admin = bearer(service.token(Role.ADMIN))
    queued = _stored_run(service, {"hostile": "queued"}, ended=False)
    answer = httpx.delete(f"{service.url}/api/v1/runs/{queued}", headers=admin)
    assert answer.status_code == 409 and "cancel it first" in answer.json()["detail"], answer.text
    assert httpx.post(f"{service.url}/api/v1/runs/{queued}/cancel", headers=admin).status_code == 200
    assert httpx.delete(f"{service.url}/api/v1/runs/{queued}", headers=admin).status_code == 204

    reference = _stored_run(service, {"hostile": "reference"})
    with session_scope(service.database_url) as session:
        run = session.get(Run, reference)
        assert run is not None
        run.status = "passed"
        baseline = session.scalars(select(Baseline).where(Baseline.profile == PROFILE)).first()
        assert baseline is not None  # seeded from the profile
        baseline.reference_run_id = reference
    answer = httpx.delete(f"{service.url}/api/v1/runs/{reference}", headers=admin)
    assert answer.status_code == 409 and "reference of baseline" in answer.json()["detail"], answer.text
    assert httpx.get(f"{service.url}/api/v1/runs/{reference}").status_code == 200


def test_cli_deletes_an_ended_run_and_refuses_a_queued_one(service: LiveService) -> None:
    ended, queued = _stored_run(service, {"hostile": "cli"}), _stored_run(service, {"hostile": "cli"}, ended=False)
    kvcanary = [sys.executable, "-m", "service", "runs", "delete"]
    done = subprocess.run([*kvcanary, str(ended)], env=service.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and f"deleted run {ended}" in done.stdout, done.stdout + done.stderr
    refused = subprocess.run([*kvcanary, str(queued)], env=service.env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "cancel it first" in refused.stdout, refused.stdout + refused.stderr
    assert httpx.get(f"{service.url}/api/v1/runs/{ended}").status_code == 404
    assert httpx.get(f"{service.url}/api/v1/runs/{queued}").status_code == 200


@pytest.mark.parametrize("command", ["submit", "run"])
def test_cli_refuses_labels_it_could_not_store(service: LiveService, command: str) -> None:
    """A label given as bytes that are not UTF-8 reaches Python as a lone surrogate."""
    argv = [sys.executable.encode(), b"-m", b"service", command.encode()]
    if command == "submit":
        argv += [b"--url", service.url.encode(), b"--profile", PROFILE.encode()]
    else:
        argv += [PROFILE.encode()]
    env = {**service.env, "KVCANARY_TOKEN": service.token(Role.CI)}
    done = subprocess.run([*argv, b"--label", b"hostile=x\xff"], env=env, capture_output=True, timeout=60)
    output = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 2 and "lone surrogate" in output, output
    assert "x\\udcff" not in [run["labels"]["hostile"] for run in _hostile_runs(service)]


def test_profiles_and_schedules_refuse_text_they_could_not_store() -> None:
    for make in (
        lambda: BaselineSpec(source="PR \x00 47671"),
        lambda: BaselineSpec(source="PR \ud800"),
        lambda: ScheduleSpec(cron="0 3 * * *", labels={"a": "\ud800"}),
        lambda: ScheduleUpdate(name="nightly", labels={"a": "x\ud800"}),
        lambda: BaselineUpdate(profile=PROFILE, suite="gsm8k", metric="strict-match", source="\ud800"),
    ):
        with pytest.raises(ValidationError, match=r"NUL|lone surrogate"):
            make()


def test_deleting_a_run_takes_its_rows_and_keeps_an_audit_event(database_url: str) -> None:
    """On SQLite and PostgreSQL: samples, results, events and alert checks go with the run (the
    database's cascades); the audit event stays."""
    with session_scope(database_url) as session:
        run, _ = queue.enqueue(
            session,
            profile=PROFILE,
            trigger="ci",
            triggered_by="ci",
            labels={"a": "b"},
            overrides={},
            arms=[],
            max_attempts=1,
        )
        session.flush()
        queue.request_cancel(session, run, "test")
        session.add_all(
            [
                Sample(run_id=run.id, arm="fixed", suite="gsm8k", key="0", prompt_hash="h"),
                SuiteResult(run_id=run.id, arm="fixed", suite="gsm8k", metric="strict-match", value=0.5, n=1),
                AlertCheck(run_id=run.id),
            ]
        )
        run_id = run.id
    with session_scope(database_url) as session:
        with pytest.raises(removal.RunNotFound):
            removal.delete_run(session, run_id + 1000, "token admin")
        event = removal.delete_run(session, run_id, "token admin")
    with session_scope(database_url, write=False) as session:
        assert session.get(Run, run_id) is None
        for model in (Sample, SuiteResult, RunEvent, AlertCheck):
            assert session.scalars(select(model).where(model.run_id == run_id)).all() == [], model
        kept = session.get(AuditEvent, event.id)
        assert kept is not None and kept.detail["labels"] == {"a": "b"} and kept.target == f"run {run_id}"
