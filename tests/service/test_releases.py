"""Releases against a real `kvcanary serve` on a seeded SQLite file: the API, the pages' HTML, the CLI.

The seed (`tests/browser/release_seed.py`) holds a ready, a blocked and an incomplete release of
`vllm_version`, and one whose value carries markup, pipes, quotes and URL delimiters.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from markdown_it import MarkdownIt
from typer.testing import CliRunner

from service.cli import app
from service.db.migrate import upgrade
from service.releases.markdown import md, release_markdown
from service.releases.schemas import ReleaseSummary
from service.releases.summary import judge
from service.settings import GATE_ROLES
from tests.browser.release_seed import (
    BLOCKED,
    HOSTILE,
    KEY,
    PARTIAL,
    PREVIOUS,
    REQUIRED,
    SeededReleases,
    seed_releases,
)
from tests.browser.seed import FILLER, GSM8K, PROFILES, WHISPER
from tests.conftest import OFFLINE_ENV
from tests.service.conftest import LiveService
from tests.service.test_client_imports import server_modules

# `kvcanary` with the server's packages made unimportable, as a bare `pip install kvcanary` has it.
CLIENT_ONLY = """
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in set(sys.argv[1].split(",")):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not in the client install)")
sys.meta_path.insert(0, Blocked())
from service.cli import app
app(sys.argv[2:], prog_name="kvcanary")
"""


class Releases(LiveService):
    seeded: SeededReleases

    def release(self, value: str, **params: str) -> httpx.Response:
        return httpx.get(f"{self.url}/api/v1/releases/{quote(f'{KEY}={value}', safe='=')}", params=params)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Releases]:
    folder = tmp_path_factory.mktemp("releases") / "data"
    profiles = folder / "profiles"
    profiles.mkdir(parents=True)
    for name, text in PROFILES.items():
        (profiles / f"{name}.yaml").write_text(text)
    env = {
        **os.environ, **OFFLINE_ENV, "KVCANARY_DATA_DIR": str(folder), "KVCANARY_START_WORKER": "false",
        "KVCANARY_PROFILES_DIR": str(profiles), "KVCANARY_RELEASE_REQUIRED_PROFILES": ",".join(REQUIRED),
    }  # fmt: skip
    live = Releases(folder, env)
    upgrade(live.database_url)
    live.seeded = seed_releases(live.database_url)
    live.start()
    yield live
    live.stop()


def test_a_failing_required_profile_blocks_the_release_and_is_named(service: Releases) -> None:
    response = service.release(BLOCKED)
    assert response.status_code == 200, response.text
    summary = ReleaseSummary.model_validate(response.json())
    assert summary.state == "blocked"
    assert summary.line.startswith(f"blocked: {GSM8K} failed (run #{service.seeded.runs[BLOCKED][GSM8K]})")
    assert "gsm8k.strict-match 0.4250 (pass line 0.7911)" in summary.line
    assert WHISPER not in summary.line, "the profile that passed is not named"
    assert [b.split(" ")[0] for b in summary.blocking] == [GSM8K] and summary.missing == []
    rows = {row.profile: row for row in summary.profiles}
    assert (rows[GSM8K].outcome, rows[WHISPER].outcome) == ("failed", "passed")
    assert all(rows[p].required for p in REQUIRED)


def test_the_change_is_held_against_the_previous_release_with_its_paired_diff(service: Releases) -> None:
    summary = ReleaseSummary.model_validate(service.release(BLOCKED).json())
    assert summary.previous == PREVIOUS
    gsm8k = next(row for row in summary.profiles if row.profile == GSM8K)
    assert gsm8k.comparison is not None
    before, after = service.seeded.runs[PREVIOUS][GSM8K], service.seeded.runs[BLOCKED][GSM8K]
    assert gsm8k.comparison.previous_run_id == before
    strict = next(c for c in gsm8k.comparison.metrics if c.metric == "strict-match")
    assert strict.worse and strict.delta == pytest.approx(strict.current - strict.previous) and strict.delta < -0.4
    flips = next(p for p in gsm8k.comparison.paired if p.metric == "strict-match")
    assert (flips.worse, flips.better) == (service.seeded.blocked_flips, 0)
    link = gsm8k.comparison.diff_links["fixed"]
    assert link == f"{service.url}/compare/{before}/{after}"
    diff = httpx.get(f"{service.url}/api/v1/runs/{before}/diff/{after}").json()
    strict_diff = next(m for m in diff["suites"][0]["accuracy"] if m["metric"] == "strict-match")
    assert len(strict_diff["right_to_wrong"]) == flips.worse, "the release's count is the compare view's"
    assert httpx.get(link).status_code == 200
    whisper = next(row for row in summary.profiles if row.profile == WHISPER)
    assert whisper.comparison is not None
    [utterances] = whisper.comparison.paired
    assert (utterances.kind, utterances.worse, utterances.better) == ("wer", 1, 0)


def test_a_required_profile_still_queued_leaves_the_release_incomplete(service: Releases) -> None:
    summary = ReleaseSummary.model_validate(service.release(PARTIAL).json())
    assert summary.state == "incomplete"
    assert summary.line == f"incomplete: {WHISPER} is still running (run #{service.seeded.queued_whisper})"
    gsm8k = next(row for row in summary.profiles if row.profile == GSM8K)
    assert {m.arm for m in gsm8k.metrics} == {"stock", "fixed"}, "each arm of the A/B run has its outcome"
    assert gsm8k.comparison is not None
    assert set(gsm8k.comparison.diff_links) == {"fixed"}, "the previous run had the fixed arm only"
    assert "arm_a=fixed&arm_b=fixed" in gsm8k.comparison.diff_links["fixed"]
    named = ReleaseSummary.model_validate(service.release(PARTIAL, previous=PREVIOUS).json())
    assert named.previous == PREVIOUS
    against = next(r for r in named.profiles if r.profile == GSM8K).comparison
    assert against is not None and against.previous_run_id == service.seeded.runs[PREVIOUS][GSM8K]


def test_ready_with_any_characters_in_the_value(service: Releases) -> None:
    response = service.release(HOSTILE)
    assert response.status_code == 200, response.text
    summary = ReleaseSummary.model_validate(response.json())
    assert summary.value == HOSTILE and summary.state == "ready"
    assert summary.line == f"ready: every required profile passed ({GSM8K}, {WHISPER})"
    assert summary.previous == PARTIAL
    extra = next(row for row in summary.profiles if row.profile == FILLER)
    assert not extra.required and extra.outcome == "passed"
    assert summary.links["dashboard"].endswith("/releases/" + quote(f"{KEY}={HOSTILE}", safe="="))

    page = httpx.get(summary.links["dashboard"])
    assert page.status_code == 200
    assert "&lt;b&gt;bold&lt;/b&gt;" in page.text and "<b>bold</b>" not in page.text
    assert 'data-state="ready"' in page.text
    listing = httpx.get(f"{service.url}/releases").text
    assert "<b>bold" not in listing and 'href="/releases/vllm_version=0.26.0rc1%2B%3Cb%3Ebold' in listing
    trends = httpx.get(f"{service.url}/profiles/{GSM8K}").text
    data = re.search(r'<script type="application/json" id="release-trend-data">(.*?)</script>', trends, re.S)
    assert data is not None and "<b>" not in data[1]
    assert json.loads(data[1])["releases"] == [PREVIOUS, BLOCKED, PARTIAL, HOSTILE]


def test_markdown_escapes_every_cell() -> None:
    assert md(HOSTILE) == r"0.26.0rc1+\<b\>bold\</b\>\|\*x\*\&amp;" + "\"q'/?\\#%20"
    assert md("1. x\nnext|cell") == r"1\. x next\|cell"


def test_release_report_prints_markdown_and_json_with_exit_codes(service: Releases) -> None:
    runner = CliRunner()
    blocked = runner.invoke(app, ["release-report", f"{KEY}={BLOCKED}", "--url", service.url])
    assert blocked.exit_code == 1, blocked.output
    lines = blocked.stdout.splitlines()
    assert lines[0] == "## kvcanary release vllm\\_version=0.25.0: BLOCKED"
    assert f"- {md(GSM8K)} failed" in blocked.stdout
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 2 + 3, "header, rule, two GSM8k metrics, one WER metric"
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 10 for line in table), "nine cells on every row"
    assert f"/compare/{service.seeded.runs[PREVIOUS][GSM8K]}/{service.seeded.runs[BLOCKED][GSM8K]}" in blocked.stdout

    hostile = runner.invoke(app, ["release-report", f"{KEY}={HOSTILE}", "--url", service.url, "--format", "json"])
    assert hostile.exit_code == 0, hostile.output
    summary = ReleaseSummary.model_validate_json(hostile.stdout)
    assert summary.value == HOSTILE and summary.state == "ready"
    rendered = MarkdownIt("commonmark").enable("table").render(release_markdown(summary))
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", rendered, re.S)[1:]]
    assert [len(row) for row in cells] == [9] * 4, "a rendered table row per metric, nine cells each"
    title = re.search(r"<h2>(.*?)</h2>", rendered)
    assert title is not None and html.unescape(title[1]) == f"kvcanary release {KEY}={HOSTILE}: READY"
    assert "<b>" not in rendered

    partial = runner.invoke(
        app, ["release-report", f"{KEY}={PARTIAL}", "--url", service.url, "--previous", PREVIOUS]
    )  # fmt: skip
    assert partial.exit_code == 3, partial.output
    assert f"change since vllm\\_version={PREVIOUS}" in partial.stdout

    client = subprocess.run(
        [sys.executable, "-c", CLIENT_ONLY, ",".join(sorted(server_modules())), "release-report", f"{KEY}={BLOCKED}"],
        env={**os.environ, "KVCANARY_URL": service.url}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert client.returncode == 1, client.stderr
    assert client.stdout == blocked.stdout, "the client install prints the same report"

    missing = runner.invoke(app, ["release-report", f"{KEY}=9.9.9", "--url", service.url])
    assert missing.exit_code == 2
    assert "404: no run is labelled vllm_version=9.9.9" in missing.stderr


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/api/v1/releases/no_such_key=1", "no run carries a label 'no_such_key'"),
        (f"/api/v1/releases/{KEY}=9.9.9", f"recent values of {KEY}: {HOSTILE}, {PARTIAL}"),
        ("/api/v1/releases/not-a-release", "write KEY=VALUE"),
        ("/api/v1/releases/Bad%20Key=1", "write KEY=VALUE"),
        (f"/api/v1/releases/{KEY}={BLOCKED}?previous=0.0.1", f"no run is labelled {KEY}=0.0.1"),
    ],
)
def test_unknown_keys_and_releases_answer_404_saying_what(service: Releases, path: str, says: str) -> None:
    response = httpx.get(service.url + path)
    assert response.status_code == 404, response.text
    assert says in response.json()["detail"]


def test_pages_for_unknown_keys_and_releases_are_404_with_an_empty_state(service: Releases) -> None:
    empty = httpx.get(f"{service.url}/releases/{KEY}=9.9.9")
    assert empty.status_code == 404
    assert "no run is labelled vllm_version=9.9.9" in empty.text
    assert f'href="/releases/{KEY}={BLOCKED}"' in empty.text, "recent releases are offered"
    unknown = httpx.get(f"{service.url}/releases", params={"key": "no_such_key"})
    assert unknown.status_code == 404 and "No run carries a label" in unknown.text
    bad = httpx.get(f"{service.url}/releases", params={"key": "<script>"})
    assert bad.status_code == 404 and "<script>" not in bad.text


def test_the_list_is_newest_first_with_each_state(service: Releases) -> None:
    index = httpx.get(f"{service.url}/api/v1/releases").json()
    assert index["key"] == KEY and index["required"] == list(REQUIRED)
    assert [(r["value"], r["state"]) for r in index["releases"]] == [
        (HOSTILE, "ready"),
        (PARTIAL, "incomplete"),
        (BLOCKED, "blocked"),
        (PREVIOUS, "ready"),
    ]
    assert GSM8K in index["releases"][2]["line"]
    by_sha = httpx.get(f"{service.url}/api/v1/releases", params={"key": "git_sha"}).json()
    assert len(by_sha["releases"]) == 8, "one release per git sha: each decided seeded run has its own"


def test_nothing_required_is_incomplete_and_says_where_to_configure() -> None:
    state, line, blocking, missing = judge([], {GSM8K: "passed"}, {}, {})
    assert state == "incomplete" and "KVCANARY_RELEASE_REQUIRED_PROFILES" in line
    assert blocking == missing == [], "a passed profile that is not required is neither"
    assert judge([GSM8K], {GSM8K: "error"}, {GSM8K: "errored (run #4): CUDA"}, {})[:2] == (
        "blocked",
        f"blocked: {GSM8K} errored (run #4): CUDA",
    )


def test_the_summary_reads_the_same_on_sqlite_and_postgresql(database_url: str) -> None:
    """The label queries (JSON on SQLite, JSONB on PostgreSQL) find the same releases and runs."""
    from service.db.session import session_scope
    from service.releases.summary import release_index, release_summary
    from service.releases.trends import release_trends

    seeded = seed_releases(database_url)
    with session_scope(database_url, write=False) as session:
        summary = release_summary(session, KEY, BLOCKED, required=list(REQUIRED), gate_roles=GATE_ROLES, profiles={})
        index = release_index(session, KEY, list(REQUIRED), GATE_ROLES)
        trends = release_trends(session, GSM8K, KEY, 10, GATE_ROLES)
    assert (summary.state, summary.previous) == ("blocked", PREVIOUS)
    gsm8k = next(row for row in summary.profiles if row.profile == GSM8K)
    assert gsm8k.comparison is not None
    assert next(p for p in gsm8k.comparison.paired if p.metric == "strict-match").worse == seeded.blocked_flips
    assert [r.value for r in index.releases] == [HOSTILE, PARTIAL, BLOCKED, PREVIOUS]
    assert trends["releases"] == [PREVIOUS, BLOCKED, PARTIAL, HOSTILE]


def test_the_comparison_is_computed_when_the_deciding_run_ends_not_on_a_read(database_url: str) -> None:
    """Stored at the run's end: a read returns it even once the samples it was computed from are gone."""
    from sqlalchemy import delete

    from service.db.models import Sample
    from service.db.session import session_scope
    from service.releases.settled import settle_release
    from service.releases.summary import release_summary

    seeded = seed_releases(database_url)
    before, after = seeded.runs[PREVIOUS][GSM8K], seeded.runs[BLOCKED][GSM8K]
    with session_scope(database_url) as session:
        assert settle_release(session, after, KEY, GATE_ROLES) == 2  # against PREVIOUS, and PARTIAL against it
        session.execute(delete(Sample).where(Sample.run_id.in_([before, after])))
    with session_scope(database_url, write=False) as session:
        summary = release_summary(session, KEY, BLOCKED, required=list(REQUIRED), gate_roles=GATE_ROLES, profiles={})
    gsm8k = next(row for row in summary.profiles if row.profile == GSM8K)
    assert gsm8k.comparison is not None and gsm8k.comparison.previous_run_id == before
    assert next(p for p in gsm8k.comparison.paired if p.metric == "strict-match").worse == seeded.blocked_flips
