"""Regression alerts delivered over real HTTP to a receiver the test runs on 127.0.0.1.

The finished runs are written through the ORM, with judgements computed by the real verdict
code from per-item results: producing a real `fail` verdict end to end needs a vLLM engine
and a model that regresses, which is the engine tests' business, not the alerting's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from evals.kinds.accuracy import judge_accuracy
from evals.verdict import Baseline, MetricJudgement
from service.alerting.watcher import alert_run
from service.arms import arm_verdicts, outcome
from service.db.models import AlertCheck, Run, RunEvent, SuiteResult
from service.db.session import session_scope
from service.runs import queue
from service.runs.state import Status, transition
from service.settings import Settings
from tests.service.conftest import StartService, free_port

PUBLIC_URL = "https://kvcanary.example.org"
BASELINE = Baseline(value=0.87, direction="higher", tolerance_kind="absolute", tolerance=0.08, source="vLLM CI")


@dataclass
class Receiver:
    """A webhook endpoint: records every POST; answers `fail_first` requests with 503 first."""

    fail_first: int = 0
    status_after: int = 200
    requests: list[tuple[str, Any]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def bodies(self, path: str) -> list[Any]:
        return [body for p, body in self.requests if p == path]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append((self.path, body))
            code = 503 if len(state.requests) <= state.fail_first else state.status_after
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"ok" if code == 200 else b"receiver says no")

        def log_message(self, *args: Any) -> None:
            pass

    state.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=state.server.serve_forever, daemon=True).start()
    yield state
    state.server.shutdown()
    state.server.server_close()


def _judged(correct: int, total: int = 200) -> MetricJudgement:
    """A real judgement of `correct` right answers out of `total` against the GSM8k baseline."""
    items = {f"q{i}": i < correct for i in range(total)}
    return judge_accuracy("gsm8k", "strict-match", items, BASELINE, None)


def _finished_run(
    url: str,
    profile: str,
    end: Status,
    judgement: MetricJudgement | None,
    error: str = "",
    expect: dict[str, str] | None = None,
) -> int:
    """A run moved through the real state machine to `end`, with its judged metric stored (arm
    `fixed`) and, with `expect`, its arm's verdict and outcome as scoring makes them."""
    with session_scope(url) as session:
        run, _ = queue.enqueue(
            session,
            profile=profile,
            trigger="nightly",
            triggered_by="test",
            labels={"vllm_version": "0.24.0"},
            overrides={},
            arms=[],
            expect=expect,
            max_attempts=1,
        )
        session.flush()
        for step in (Status.STARTING_ENGINE, Status.RUNNING):
            transition(session, run, step)
        if end in (Status.PASSED, Status.FAILED):
            transition(session, run, Status.SCORING)
        if judgement is not None:
            run.verdict = judgement.verdict
            run.verdict_summary = f"{judgement.verdict}: gsm8k.strict-match {judgement.value:.4f}: {judgement.verdict}"
            session.add(
                SuiteResult(
                    run_id=run.id,
                    arm="fixed",
                    suite="gsm8k",
                    metric="strict-match",
                    value=judgement.value,
                    n=judgement.n,
                    baseline_value=judgement.baseline,
                    threshold=judgement.threshold,
                    verdict=judgement.verdict,
                    explanation=judgement.explanation,
                )
            )
        if expect and judgement is not None:
            run.arm_verdicts = arm_verdicts(["fixed"], [("fixed", judgement.verdict)], [])
            run.outcome = outcome(expect, run.arm_verdicts)
        run.error = error
        transition(session, run, end)
        return run.id


def _events(url: str, run_id: int, kind: str) -> list[str]:
    with session_scope(url) as session:
        return list(session.scalars(select(RunEvent.message).where(RunEvent.run_id == run_id, RunEvent.kind == kind)))


def _settings(tmp_path: Path, url: str, **fields: Any) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=url, public_url=PUBLIC_URL, **fields)


def test_two_services_alert_a_failed_run_once_with_its_verdict_and_link(
    start_service: StartService, receiver: Receiver, database_url: str, tmp_path: Path
) -> None:
    passed, failing = _judged(176), _judged(120)
    assert (passed.verdict, failing.verdict) == ("pass", "fail")
    previous = _finished_run(database_url, "kimi", Status.PASSED, passed)
    failed = _finished_run(database_url, "kimi", Status.FAILED, failing)
    empty_profiles = tmp_path / "profiles"
    empty_profiles.mkdir()
    env = {
        "KVCANARY_DATABASE_URL": database_url,
        "KVCANARY_PROFILES_DIR": str(empty_profiles),
        "KVCANARY_PUBLIC_URL": PUBLIC_URL,
        "KVCANARY_ALERT_WEBHOOKS": json.dumps([f"{receiver.url}/generic"]),
        "KVCANARY_ALERT_SLACK_WEBHOOKS": json.dumps([f"{receiver.url}/slack/T000/B000/secret"]),
        "KVCANARY_ALERT_POLL_S": "0.2",
    }
    for name in ("a", "b"):
        start_service(data_dir=tmp_path / name, **env)
    deadline = time.monotonic() + 30
    while len(receiver.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # ten more polls by each service: a second delivery would show up now

    assert sorted(p for p, _ in receiver.requests) == ["/generic", "/slack/T000/B000/secret"]
    [generic] = receiver.bodies("/generic")
    assert generic["kind"] == "run_failed"
    assert generic["run"]["id"] == failed and generic["run"]["url"] == f"{PUBLIC_URL}/runs/{failed}"
    assert generic["run"]["labels"] == {"vllm_version": "0.24.0"} and generic["previous_run_id"] == previous
    [metric] = generic["metrics"]
    assert (metric["verdict"], metric["previous_verdict"], metric["changed"]) == ("fail", "pass", True)
    assert metric["explanation"] == failing.explanation
    [slack] = receiver.bodies("/slack/T000/B000/secret")
    assert set(slack) == {"text"} and slack["text"] == generic["text"]
    assert failing.explanation in slack["text"] and f"{PUBLIC_URL}/runs/{failed}" in slack["text"]
    assert f"was pass in run {previous}" in slack["text"]

    sent = _events(database_url, failed, "alert_sent")
    assert len(sent) == 2 and not any("secret" in message for message in sent)
    with session_scope(database_url) as session:
        checks = session.execute(select(AlertCheck.run_id, AlertCheck.outcome))
        outcomes = {run_id: outcome for run_id, outcome in checks}
    assert outcomes[failed] == "run_failed"
    assert outcomes[previous].startswith("no alert")  # passed, nothing earlier to change from


def test_a_changed_verdict_on_a_passing_run_is_alerted(receiver: Receiver, database_url: str, tmp_path: Path) -> None:
    earlier = _finished_run(database_url, "whisper", Status.PASSED, _judged(176))
    inconclusive = _judged(176, total=20)
    assert inconclusive.verdict == "inconclusive"
    later = _finished_run(database_url, "whisper", Status.PASSED, inconclusive)
    again = _judged(20, total=20)
    assert again.verdict == "inconclusive"
    unchanged = _finished_run(database_url, "whisper", Status.PASSED, again)
    settings = _settings(tmp_path, database_url, alert_webhooks=[receiver.url])

    for run_id in (later, unchanged):
        assert alert_run(settings, run_id, "test")
    assert not alert_run(settings, later, "another process")  # already claimed: nothing sent twice

    [body] = [b for _, b in receiver.requests]
    assert body["kind"] == "verdict_changed" and body["run"]["id"] == later and body["previous_run_id"] == earlier
    assert "inconclusive (was pass in run" in body["text"] and inconclusive.explanation in body["text"]


def test_an_error_run_is_alerted_with_its_error(receiver: Receiver, database_url: str, tmp_path: Path) -> None:
    broken = _finished_run(database_url, "kimi", Status.ERROR, None, error="EngineStartError: CUDA out of memory")
    settings = _settings(tmp_path, database_url, alert_slack_webhooks=[receiver.url])
    assert alert_run(settings, broken, "test")
    [body] = [b for _, b in receiver.requests]
    assert "ERROR" in body["text"] and "CUDA out of memory" in body["text"]


def test_a_run_whose_arms_did_not_do_what_was_expected_is_alerted_and_one_that_did_is_not(
    receiver: Receiver, database_url: str, tmp_path: Path
) -> None:
    """The gate watching itself: a canary run expected to fail that fails says nothing; one that
    passes (the bug went unseen) is alerted as `run_unexpected`, naming the arm."""
    caught = _finished_run(database_url, "canary", Status.FAILED, _judged(120), expect={"fixed": "fail"})
    unseen = _finished_run(database_url, "canary", Status.PASSED, _judged(176), expect={"fixed": "fail"})
    settings = _settings(tmp_path, database_url, alert_webhooks=[receiver.url])
    for run_id in (caught, unseen):
        assert alert_run(settings, run_id, "test")
    [body] = [b for _, b in receiver.requests]
    assert body["kind"] == "run_unexpected" and body["run"]["id"] == unseen and body["run"]["outcome"] == "unexpected"
    assert "did NOT do what was expected" in body["text"] and "fixed was expected to fail and passed" in body["text"]
    with session_scope(database_url) as session:
        assert session.get(AlertCheck, caught).outcome.startswith("no alert")  # type: ignore[union-attr]


def test_an_unreachable_webhook_is_retried_with_backoff_and_recorded_without_failing_the_run(
    database_url: str, tmp_path: Path
) -> None:
    failing = _judged(100)
    run_id = _finished_run(database_url, "kimi", Status.FAILED, failing)
    with session_scope(database_url) as session:
        before = session.get(Run, run_id)
        assert before is not None
        finished_at, verdict = before.finished_at, before.verdict
    nobody = f"http://127.0.0.1:{free_port()}/hook"  # bound once, now closed: connection refused
    settings = _settings(tmp_path, database_url, alert_webhooks=[nobody], alert_attempts=3, alert_backoff_s=0.3)

    began = time.monotonic()
    assert alert_run(settings, run_id, "test")
    elapsed = time.monotonic() - began

    assert elapsed >= 0.3 + 0.6  # two waits, the second twice the first
    [failure] = _events(database_url, run_id, "alert_failed")
    assert "after 3 attempt(s)" in failure and "ConnectError" in failure and "/hook" not in failure
    assert _events(database_url, run_id, "alert_sent") == []
    with session_scope(database_url) as session:
        after = session.get(Run, run_id)
        assert after is not None
        assert (after.status, after.verdict, after.finished_at) == (Status.FAILED.value, verdict, finished_at)


def test_a_receiver_that_recovers_gets_the_alert_and_a_refusing_one_is_not_retried(
    receiver: Receiver, database_url: str, tmp_path: Path
) -> None:
    receiver.fail_first = 2
    first = _finished_run(database_url, "kimi", Status.FAILED, _judged(100))
    settings = _settings(tmp_path, database_url, alert_webhooks=[receiver.url], alert_attempts=4, alert_backoff_s=0.05)
    assert alert_run(settings, first, "test")
    assert len(receiver.requests) == 3  # 503, 503, 200
    assert len(_events(database_url, first, "alert_sent")) == 1

    receiver.status_after = 400
    second = _finished_run(database_url, "kimi", Status.FAILED, _judged(100))
    assert alert_run(settings, second, "test")
    assert len(receiver.requests) == 4  # one more try only: a 400 will not change on retry
    [failure] = _events(database_url, second, "alert_failed")
    assert "after 1 attempt(s): HTTP 400" in failure


def test_slack_alerts_escape_control_sequences_in_every_quoted_value(
    receiver: Receiver, database_url: str, tmp_path: Path
) -> None:
    """A label `<!channel>` must not ping the channel, nor `<url|text>` show a link as other text;
    the generic JSON body keeps the values as they are (its readers parse JSON, not Slack markup)."""
    hostile = "<!channel> see <https://evil.example/|the run page> & more"
    failing = _judged(100)
    run_id = _finished_run(database_url, "kimi", Status.FAILED, failing, error="boom <!here> & <@U123>")
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert run is not None
        run.labels = {"git_sha": hostile}
    settings = _settings(
        tmp_path, database_url, alert_webhooks=[f"{receiver.url}/generic"], alert_slack_webhooks=[receiver.url]
    )
    assert alert_run(settings, run_id, "test")
    [slack] = receiver.bodies("/")
    [generic] = receiver.bodies("/generic")
    text = slack["text"]
    assert "<" not in text and ">" not in text, text
    assert "&lt;!channel&gt; see &lt;https://evil.example/|the run page&gt; &amp; more" in text
    assert "boom &lt;!here&gt; &amp; &lt;@U123&gt;" in text
    assert f"{PUBLIC_URL}/runs/{run_id}" in text  # the link to the run still works
    assert generic["run"]["labels"]["git_sha"] == hostile and hostile in generic["text"]
    assert "slack_text" not in generic


def test_a_passed_run_with_a_drift_warning_is_alerted(receiver: Receiver, database_url: str, tmp_path: Path) -> None:
    """`warn` is not a failure, but every run that carries one says so, not only the first."""
    from evals.drift_verdict import judge_drift
    from evals.logprob_drift import PromptDrift

    def row(kl: float) -> dict[str, Any]:
        return PromptDrift(None, True, 0.0, kl, kl, 1.0, 0.0, True).as_dict()

    rows = {f"p{i}": {"floor": row(0.0), "drift": row(2e-5 * (1 + i % 3)), "finite": True} for i in range(16)}
    warned = judge_drift("drift", "kl", rows, None)
    assert warned.verdict == "warn", warned.explanation
    first = _finished_run(database_url, "drift", Status.PASSED, warned)
    second = _finished_run(database_url, "drift", Status.PASSED, warned)
    settings = _settings(tmp_path, database_url, alert_webhooks=[receiver.url])
    for run_id in (first, second):
        assert alert_run(settings, run_id, "test")
    bodies = [b for _, b in receiver.requests]
    assert [b["kind"] for b in bodies] == ["run_warned", "run_warned"]
    assert "passed with a warning" in bodies[0]["text"] and warned.explanation in bodies[0]["text"]
