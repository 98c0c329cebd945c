"""What may decide a release, and what every reader of a release shows (issue: a release verdict only a
full gate run can set). Runs are queued through the API with real tokens and end as a worker would
have stored them (status, verdict, results); no engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from service.alerting.messages import compose
from service.app import create_app
from service.auth import create_token
from service.cli import app as cli
from service.db.models import Run, SuiteResult, utcnow
from service.db.session import session_scope
from service.releases.decision import RunFacts, decide
from service.releases.markdown import md, release_markdown
from service.releases.schemas import ReleaseSummary
from service.report import write_junit
from service.roles import Role
from service.runs import queries
from service.settings import Settings
from tests.service.conftest import bearer

GSM = "gsm8k-tiny-cpu"
DRIFT = "drift-tiny-cpu"
YAML = {
    GSM: "model: fixture:gsm8k-tiny\nserved_model_name: tiny\nsuites:\n  - {suite: gsm8k}\n"
    "baselines:\n  gsm8k:\n    strict-match: {value: 1.0, tolerance: {kind: absolute, value: 0.08}}\n",
    DRIFT: "model: fixture:gsm8k-tiny\nserved_model_name: tiny\nsuites:\n  - {suite: drift, limit: 12}\n",
}
KEY = "vllm_version"


class Service:
    def __init__(self, client: TestClient, url: str) -> None:
        self.client, self.url = client, url
        with session_scope(url) as session:
            self.ci = bearer(create_token(session, "ci-bot", Role.CI))
            self.admin = bearer(create_token(session, "release-admin", Role.ADMIN))

    def trigger(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> int:
        got = self.client.post("/api/v1/runs", json=body, headers=headers or self.ci)
        assert got.status_code == 201, got.text
        return int(got.json()["id"])

    def end(self, run_id: int, status: str, verdict: str, results: Sequence[tuple[str, str, float, str, dict]]) -> None:
        """Store the run's end as the pipeline would: status, verdict, one result per (suite, metric)."""
        with session_scope(self.url) as session:
            run = session.get(Run, run_id)
            assert run is not None
            accuracy = run.profile == GSM
            run.status, run.verdict, run.finished_at = status, verdict, utcnow()
            run.verdict_summary = f"{verdict}: " + "; ".join(f"{s}.{m}: {v}" for s, m, _, v, _ in results)
            for suite, metric, value, judged, details in results:
                session.add(
                    SuiteResult(
                        run_id=run_id, arm="fixed", suite=suite, metric=metric, value=value, n=1319,
                        direction="higher" if accuracy else "lower", baseline_value=1.0 if accuracy else None,
                        threshold=0.92 if accuracy else 0.01, verdict=judged, explanation="", details=details,
                    )
                )  # fmt: skip

    def release(self, value: str) -> ReleaseSummary:
        got = self.client.get(f"/api/v1/releases/{quote(f'{KEY}={value}', safe='=')}")
        assert got.status_code == 200, got.text
        return ReleaseSummary.model_validate(got.json())


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for name, text in YAML.items():
        (profiles / f"{name}.yaml").write_text(text)
    settings = Settings(
        data_dir=tmp_path / "data", profiles_dir=profiles, start_worker=False, release_required_profiles=[GSM]
    )
    with TestClient(create_app(settings)) as client:
        yield Service(client, settings.resolved_database_url())


def labelled(value: str, **body: Any) -> dict[str, Any]:
    return {"profile": GSM, "labels": {KEY: value}, **body}


def test_a_smoke_run_does_not_lift_a_failed_gate_run_and_the_row_names_both(service: Service) -> None:
    """Replayed: a full run failed (0.59 against 0.92), then a ci token's `limit: 1` run came out
    inconclusive. The release stays blocked and names both; a full re-run that passes lifts it."""
    failed = service.trigger(labelled("0.40.0"))
    service.end(failed, "failed", "fail", [("gsm8k", "strict-match", 0.59, "fail", {})])
    smoke = service.trigger(labelled("0.40.0", overrides={"limit": 1}))
    service.end(smoke, "passed", "inconclusive", [("gsm8k", "strict-match", 1.0, "inconclusive", {})])

    summary = service.release("0.40.0")
    assert summary.state == "blocked"
    assert f"{GSM} failed (run #{failed}): gsm8k.strict-match 0.5900 (pass line 0.9200)" in summary.line
    assert f"run #{smoke} (passed) does not decide: limit 1 (the profile runs gsm8k every item)" in summary.line
    [row] = summary.profiles
    assert row.run is not None and row.run.id == failed and row.outcome == "failed"
    assert [(e.id, e.why) for e in row.exploratory] == [(smoke, "limit 1 (the profile runs gsm8k every item)")]
    notes = release_markdown(summary)
    assert f"#{failed}" in notes and f"#{smoke}" in notes and "BLOCKED" in notes
    detail = service.client.get(f"/api/v1/runs/{smoke}").json()
    assert (detail["triggered_role"], detail["exploratory"]) == ("ci", "limit 1 (the profile runs gsm8k every item)")
    assert "exploratory, never decides a release: limit 1" in service.client.get(f"/runs/{smoke}").text
    [listed] = service.client.get("/api/v1/releases").json()["releases"]
    assert listed["state"] == "blocked" and f"run #{smoke}" in listed["line"]

    rerun = service.trigger(labelled("0.40.0"))
    service.end(rerun, "passed", "pass", [("gsm8k", "strict-match", 0.95, "pass", {})])
    summary = service.release("0.40.0")
    assert summary.state == "ready"
    assert summary.profiles[0].history == f"failed #{failed}, passed on re-run #{rerun}"
    assert md(f"failed #{failed}, passed on re-run #{rerun}") in release_markdown(summary)


def test_an_inconclusive_gate_run_is_no_pass_for_a_required_profile(service: Service) -> None:
    run = service.trigger(labelled("0.41.0"))
    service.end(run, "passed", "inconclusive", [("gsm8k", "strict-match", 0.93, "inconclusive", {})])
    summary = service.release("0.41.0")
    assert (summary.state, summary.profiles[0].outcome) == ("incomplete", "inconclusive")
    assert summary.missing == [
        f"{GSM} was inconclusive (run #{run}), which is not a pass: gsm8k.strict-match 0.9300 on 1319 items"
    ]


@pytest.mark.parametrize(
    "overrides",
    [{"limit": True}, {"limit": "1"}, {"limit": 1.0}],
    ids=["boolean", "string", "float"],
)
def test_integer_fields_take_integers_only(service: Service, overrides: dict[str, Any]) -> None:
    got = service.client.post("/api/v1/runs", json=labelled("0.40.0", overrides=overrides), headers=service.ci)
    assert got.status_code == 422 and "valid integer" in got.text, got.text
    arm = {"variant": "fixed", "engine": {"max_num_batched_tokens": True}}
    got = service.client.post("/api/v1/runs", json=labelled("0.40.0", compare=["fixed", arm]), headers=service.ci)
    assert got.status_code == 422 and "valid integer" in got.text, got.text


def test_a_role_that_may_not_gate_is_exploratory() -> None:
    runs = [RunFacts(1, "failed", "fail", "", "scheduler"), RunFacts(2, "passed", "pass", "", "ci")]
    decision = decide(runs, ["scheduler", "admin"])
    assert (decision.decided, decision.outcome) == (1, "failed")
    assert [(e.id, "ci, which may not gate" in e.why) for e in decision.exploratory] == [(2, True)]


def test_a_ci_token_cannot_choose_the_mutation_score_and_pages_name_the_batch(service: Service) -> None:
    fake = service.client.post(
        "/api/v1/runs", json=labelled("0.40.0", labels={KEY: "0.40.0", "mutation_batch": "fake"}), headers=service.ci
    )
    assert fake.status_code == 422 and "reserved" in fake.text
    body = {"batch": "20261207T010203Z-abcd", "profiles": [GSM], "mutants": ["batch_row_shift"]}
    assert service.client.post("/api/v1/mutation-batches", json=body, headers=service.ci).status_code == 403
    made = service.client.post("/api/v1/mutation-batches", json=body, headers=service.admin)
    assert made.status_code == 201, made.text
    [record] = made.json()
    assert (record["started_by"], record["started_role"]) == ("release-admin", "admin")
    again = service.client.post("/api/v1/mutation-batches", json=body, headers=service.admin)
    assert again.status_code == 200 and again.json() == made.json(), "a resent batch queues nothing twice"
    with session_scope(service.url) as session:  # a label stored before batches were records
        session.add(Run(profile=GSM, status="passed", trigger="ci", labels={"mutation_batch": "fake"}, arms=[]))

    matrix = service.client.get(f"/api/v1/profiles/{GSM}/mutants").json()
    assert (matrix["batch"], matrix["started_by"], matrix["started_role"]) == (body["batch"], "release-admin", "admin")
    gate = service.trigger(labelled("0.40.0"))
    service.end(gate, "passed", "pass", [("gsm8k", "strict-match", 0.95, "pass", {})])
    mutation = service.release("0.40.0").profiles[0].mutation
    assert mutation is not None and (mutation.batch, mutation.started_by) == (body["batch"], "release-admin")
    page = service.client.get(f"/releases/{KEY}=0.40.0").text
    assert f'batch <span class="mono">{body["batch"]}</span>, started by release-admin (admin)' in page
    assert "Started by release-admin (admin)" in service.client.get(f"/profiles/{GSM}").text


def test_labels_are_nfc_and_unseen_characters_are_refused_everywhere(service: Service) -> None:
    for value, character in (("0.25.1\u200b", "U+200B"), ("0.25.1\u202e", "U+202E"), ("a\u2066b", "U+2066")):
        got = service.client.post("/api/v1/runs", json=labelled(value), headers=service.ci)
        assert got.status_code == 422 and character in got.text, got.text
        schedule = {"name": "nightly", "profile": GSM, "labels": {KEY: value}}
        got = service.client.put("/api/v1/schedules", json=schedule, headers=service.admin)
        assert got.status_code == 422 and character in got.text, got.text
        refused = CliRunner().invoke(cli, ["run", GSM, "--label", f"{KEY}={value}"])
        assert refused.exit_code != 0 and character in refused.output, refused.output
    decomposed, composed = "cafe\u0301", "caf\u00e9"
    run_id = service.trigger(labelled(decomposed))
    with session_scope(service.url, write=False) as session:
        run = session.get(Run, run_id)
        assert run is not None and run.labels[KEY] == composed
    assert service.release(decomposed).value == composed, "either spelling finds the one release"


def test_doctor_reports_stored_look_alikes(service: Service, tmp_path: Path) -> None:
    with session_scope(service.url) as session:
        for value in ("0.25.1", "0.25.1\u200b", "caf\u00e9", "cafe\u0301", "0.26.0"):
            session.add(Run(profile=GSM, status="passed", trigger="ci", labels={KEY: value}))
    env = {**os.environ, "KVCANARY_DATABASE_URL": service.url, "KVCANARY_DATA_DIR": str(tmp_path)}
    found = subprocess.run([sys.executable, "-m", "service", "doctor"], env=env, capture_output=True, text=True)
    assert found.returncode == 1, found.stdout + found.stderr
    assert "'0.25.1\\u200b' (1 runs): U+200B (ZERO WIDTH SPACE" in found.stdout
    assert "looks like '0.25.1' (1 runs)" in found.stdout
    assert "'cafe\\u0301' (1 runs): not in Unicode normal form C" in found.stdout
    assert "0.26.0" not in found.stdout


def test_a_non_finite_kl_reads_not_finite_in_every_reader(service: Service, tmp_path: Path) -> None:
    run_id = service.trigger({"profile": DRIFT, "labels": {KEY: "0.42.0"}})
    service.end(run_id, "failed", "fail", [("drift", "kl", 1e30, "fail", {"kl_finite": False})])
    summary = service.release("0.42.0")
    [row] = [r for r in summary.profiles if r.profile == DRIFT]
    assert row.metrics[0].shown == "not finite" and "drift.kl not finite" in row.reasons[0]
    readers = {
        "release API": json.dumps(summary.model_dump(mode="json")["profiles"][1]["reasons"]),
        "release markdown": release_markdown(summary),
        "release page": service.client.get(f"/releases/{KEY}=0.42.0").text,
    }
    with session_scope(service.url, write=False) as session:
        run = session.get(Run, run_id)
        assert run is not None
        alert = compose(session, run, "http://kvcanary/runs/1")
        detail = queries.run_detail(session, run)
    assert alert is not None
    readers["alert"] = alert.text
    write_junit(detail, tmp_path / "junit.xml")
    readers["junit"] = (tmp_path / "junit.xml").read_text()
    for name, text in readers.items():
        assert "not finite" in text and "1e+30" not in text, name
