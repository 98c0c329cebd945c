"""The mutation matrix from stored runs: queued by `enqueue_batch`, samples through the run store,
verdicts by the real scoring, read back by the API and printed as Markdown. No engine: the
run's rows are what a worker would have stored for fixed and each mutant arm."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete

from evals.logprob_drift import ArmOutput, compare, pack
from evals.records import MetricValue, Sample
from evals.suites.base import SuiteOutcome
from service import baselines
from service.app import create_app
from service.db.migrate import upgrade
from service.db.models import Run
from service.db.models import Sample as SampleRow
from service.db.session import session_scope
from service.engine.gpus import refusal
from service.profile_catalog import configured_profiles
from service.releases.markdown import release_markdown
from service.releases.schemas import ReleaseSummary
from service.runs import batches, mutation, scoring, store
from service.settings import PACKAGED_PROFILES, Settings

PROFILE = "mutant-fixture"
YAML = """\
model: fixture:gsm8k-tiny
served_model_name: tiny
suites:
  - {suite: gsm8k}
  - {suite: drift, limit: 12}
baselines:
  gsm8k:
    strict-match: {value: 1.0, tolerance: {kind: absolute, value: 0.08}}
    flexible-extract: {value: 1.0, tolerance: {kind: absolute, value: 0.08}}
"""
QUESTIONS = [f"q{i:02d}" for i in range(40)]
PROMPTS = [f"p{i:02d}" for i in range(12)]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / f"{PROFILE}.yaml").write_text(YAML)
    return Settings(data_dir=tmp_path / "data", profiles_dir=profiles, start_worker=False)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


def answer(key: str, right: bool) -> Sample:
    extracted = "42" if right else "41"
    return Sample(
        key=key,
        prompt_hash=f"h-{key}",
        target="42",
        response=f"the answer is {extracted}",
        extracted={"strict-match": extracted, "flexible-extract": extracted},
        correct={"strict-match": right, "flexible-extract": right},
    )


def output(tokens: list[int]) -> ArmOutput:
    top = [{t: -0.1, t + 1: -3.0} for t in tokens]
    return ArmOutput(tokens, [-0.1] * len(tokens), top, [{5: -0.1, 6: -3.0}] * 4, [-0.1] * 4)


def drift_sample(key: str, mine: ArmOutput, reference: ArmOutput | None) -> Sample:
    """As the drift suite stores it: the control arm with its A/A floor, the candidate compared."""
    base = reference or mine
    data = {"prompt_ids": [1, 2], "arm": pack(mine), "floor": compare(base, base).as_dict(), "finite": True}
    data |= {"kl_tolerance": 0.01, "drift": None if reference is None else compare(reference, mine).as_dict()}
    return Sample(key=key, prompt_hash=f"h-{key}", target="", response="", data=data)


def finish(
    settings: Settings,
    run_id: int,
    seen: Mapping[str, tuple[Sequence[str], Sequence[str]]],
    dead: Sequence[str] = (),
) -> None:
    """Store what fixed and each mutant answered (mutant: (questions it got wrong, prompts whose
    tokens left the top-k)) and score the run as the pipeline does; the engines of `dead` died."""
    url = settings.resolved_database_url()
    reference = {key: output([10, 20, 30]) for key in PROMPTS}
    samples = {
        ("fixed", "gsm8k"): [answer(key, True) for key in QUESTIONS],
        ("fixed", "drift"): [drift_sample(key, reference[key], None) for key in PROMPTS],
    }
    for mutant, (wrong, diverged) in seen.items():
        samples[(mutant, "gsm8k")] = [answer(key, key not in wrong) for key in QUESTIONS]
        samples[(mutant, "drift")] = [
            drift_sample(key, output([10, 99, 98]) if key in diverged else reference[key], reference[key])
            for key in PROMPTS
        ]
    outcomes = {}
    with session_scope(url) as session:
        for (arm, suite), rows in samples.items():
            store.save_samples(session, run_id, arm, suite, "kl" if suite == "drift" else "strict-match", rows)
            if suite == "gsm8k":
                right = sum(bool(s.correct["strict-match"]) for s in rows) / len(rows)
                metrics = [MetricValue(name=m, value=right, n=len(rows)) for m in ("strict-match", "flexible-extract")]
            else:
                metrics = [MetricValue(name="kl", value=0.0, n=len(rows), direction="lower")]
            outcomes[(arm, suite)] = SuiteOutcome(metrics=metrics, samples=list(rows), empty_response_rate=0.0)
    profile = configured_profiles(settings)[PROFILE]
    arms = ["fixed", *seen, *dead]
    with session_scope(url) as session:
        run = session.get(Run, run_id)
        assert run is not None
        verdict, summary = scoring.score(session, run, profile, outcomes, arms)
        scoring.judge_arms(session, run, arms, list(dead))
        run.status = "error" if dead else "failed" if verdict == "fail" else "passed"
        run.verdict, run.verdict_summary = verdict, summary
        run.error = "; ".join(f"the engine of arm {arm!r} died while gsm8k ran: illegal memory access" for arm in dead)
        run.timings = {f"{mutant}.{suite}_s": s for mutant in seen for suite, s in (("gsm8k", 31.5), ("drift", 12.0))}
    with session_scope(url) as session:  # as the pipeline does after a run's last write
        batches.settle_run(session, run_id)


def queue_batch(settings: Settings, mutants: Sequence[str]) -> tuple[str, int]:
    profiles = configured_profiles(settings)
    batch = mutation.new_batch_id()
    with session_scope(settings.resolved_database_url()) as session:
        baselines.seed_from_profiles(session, profiles)
        record = batches.start_batch(session, profiles[PROFILE], mutants, batch, {"git_sha": "abc"}, "test", "admin")
    assert record.run_id is not None
    return batch, record.run_id


def matrix_of(client: TestClient) -> mutation.MutationMatrix:
    got = client.get(f"/api/v1/profiles/{PROFILE}/mutants")
    assert got.status_code == 200, got.text
    return mutation.MutationMatrix.model_validate(got.json())


def test_matrix_of_the_latest_batch(client: TestClient, settings: Settings) -> None:
    _, old = queue_batch(settings, ["batch_row_shift"])
    finish(settings, old, {"batch_row_shift": ([], [])})  # an older batch: not shown
    names = ["batch_row_shift", "softmax_scale_drift", "page_offset_i32", "split_lse_merge"]
    batch, run_id = queue_batch(settings, names)
    with session_scope(settings.resolved_database_url(), write=False) as session:
        queued = session.get(Run, run_id)
        assert queued is not None
        # One run: the control's engine starts once for the batch; every mutant must fail against it.
        assert [a["name"] for a in queued.arms] == ["fixed", *names]
        assert queued.expect == {"fixed": "pass", **{name: "fail" for name in names}}
        assert queued.labels["mutation_batch"] == batch
        assert queued.overrides == {"canaries": ["high_block_ids"]}  # page_offset_i32's condition
    waiting = matrix_of(client)
    assert waiting.batch == batch and (waiting.caught, waiting.judged) == (0, 0)
    assert {c.state for row in waiting.rows for c in row.cells.values()} == {"pending"}

    # Caught by both suites: wrong from the first question, off the top-k from the fourth prompt.
    # softmax_scale_drift unseen by both; page_offset_i32's engine died; split_lse_merge the same as fixed.
    unseen: tuple[list[str], list[str]] = ([], [])
    seen = {"batch_row_shift": (QUESTIONS[:20], PROMPTS[3:]), "softmax_scale_drift": unseen, "split_lse_merge": unseen}
    finish(settings, run_id, seen, dead=["page_offset_i32"])
    matrix = matrix_of(client)
    assert (matrix.batch, matrix.suites) == (batch, ["gsm8k", "drift"])
    rows = {row.mutant: row for row in matrix.rows}
    assert list(rows) == ["batch_row_shift", "split_lse_merge", "page_offset_i32", "softmax_scale_drift"]
    assert {row.run_id for row in matrix.rows} == {run_id}
    caught = rows["batch_row_shift"].cells
    # Exact McNemar, all discordant pairs one way: p = 2 * 0.5^n first falls under 0.05 at n = 6.
    assert (caught["gsm8k"].state, caught["gsm8k"].turned_at, caught["gsm8k"].items) == ("caught", 6, 40)
    # The close rule: the first prompt outside it (the fourth) exceeds the floor's none.
    assert (caught["drift"].state, caught["drift"].turned_at, caught["drift"].unit) == ("caught", 8, "prompts")
    assert caught["gsm8k"].seconds == 31.5
    missed = rows["softmax_scale_drift"].cells
    assert {c.state for c in missed.values()} == {"missed"} and missed["gsm8k"].turned_at is None
    assert {c.state for c in rows["page_offset_i32"].cells.values()} == {"died"}
    assert {c.state for c in rows["split_lse_merge"].cells.values()} == {"missed"}
    assert (matrix.caught, matrix.judged) == (2, 4)

    table = mutation.markdown([matrix])
    assert f"| batch_row_shift | caught (at 6 of 40 items, 32 s) [run {run_id}] | caught (at 8 of 12 prompts" in table
    assert "| softmax_scale_drift | missed (pass, 40 items" in table
    assert client.get("/api/v1/profiles/no-such-profile/mutants").status_code == 404

    # Computed once, when the run ended: a read does not search the samples again (they may be gone).
    assert matrix.settled_at is not None
    with session_scope(settings.resolved_database_url()) as session:
        session.execute(delete(SampleRow).where(SampleRow.run_id == run_id))
    assert matrix_of(client) == matrix


def test_profile_page_shows_the_matrix(client: TestClient, settings: Settings) -> None:
    page = client.get(f"/profiles/{PROFILE}")
    assert page.status_code == 200 and "No mutation batch yet" in page.text
    _, run_id = queue_batch(settings, ["batch_row_shift", "softmax_scale_drift"])
    finish(settings, run_id, {"batch_row_shift": (QUESTIONS[:20], PROMPTS[3:]), "softmax_scale_drift": ([], [])})
    page = client.get(f"/profiles/{PROFILE}")
    assert page.status_code == 200
    row = page.text[page.text.index('data-mutant="batch_row_shift"') :].split("</tr>")[0]
    assert row.count('data-state="caught"') == 2 and "at 6 of 40 items" in row and "at 8 of 12 prompts" in row
    missed = page.text[page.text.index('data-mutant="softmax_scale_drift"') :].split("</tr>")[0]
    assert missed.count('data-state="missed"') == 2 and f"#{run_id}" in missed


def test_cli_prints_the_stored_matrix_and_refuses_what_it_cannot_run(settings: Settings) -> None:
    upgrade(settings.resolved_database_url())
    _, run_id = queue_batch(settings, ["batch_row_shift"])
    finish(settings, run_id, {"batch_row_shift": (QUESTIONS[:20], PROMPTS[3:])})
    env = {**os.environ, "KVCANARY_DATA_DIR": str(settings.data_dir)}

    def cli(*args: str, folder: Path = settings.profiles_dir) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "service", "mutants", *args]
        folders = {**env, "KVCANARY_PROFILES_DIR": str(folder)}
        return subprocess.run(command, env=folders, capture_output=True, text=True)

    shown = cli("--show", PROFILE)
    assert shown.returncode == 0, shown.stderr
    assert f"| batch_row_shift | caught (at 6 of 40 items, 32 s) [run {run_id}] |" in shown.stdout
    never = cli("--show", "drift-tiny-cpu-triton", folder=PACKAGED_PROFILES)
    assert never.returncode == 0, never.stderr
    assert never.stdout.startswith(
        "drift-tiny-cpu-triton: no mutation batch stored yet (`kvcanary mutants drift-tiny-cpu-triton`"
    ), never.stdout
    wrong = cli("--mutant", "no_such_mutant", PROFILE)
    assert wrong.returncode == 2 and "unknown mutant no_such_mutant" in wrong.stderr
    refused = cli("drift-tiny-gpu", folder=PACKAGED_PROFILES)
    reason = refusal(configured_profiles(Settings(profiles_dir=PACKAGED_PROFILES))["drift-tiny-gpu"])
    if reason is not None:  # a CPU host: the needs_gpu profile is refused before anything is queued
        assert refused.returncode == 2 and " ".join(reason.split()[:5]) in " ".join(refused.stdout.split())


def test_a_mutant_named_twice_is_one_arm_and_its_canary_is_armed_once() -> None:
    body = mutation.run_request("p", ["nan_kv_tail"], ["tail_read", "batch_row_shift", "tail_read"], "b1", {})
    assert body["compare"] == ["fixed", "tail_read", "batch_row_shift"]
    assert body["expect"] == {"fixed": "pass", "tail_read": "fail", "batch_row_shift": "fail"}
    assert "overrides" not in body  # the profile already arms tail_read's canary
    assert mutation.run_request("p", [], ["page_offset_i32"] * 2, "b1", {})["overrides"] == {
        "canaries": ["high_block_ids"]
    }


def test_the_release_view_carries_the_latest_mutation_score(client: TestClient, settings: Settings) -> None:
    """A release's row for a profile with a mutation batch says how many mutants the gate saw."""
    _, run_id = queue_batch(settings, ["batch_row_shift", "softmax_scale_drift", "split_lse_merge"])
    page = client.get("/releases/git_sha=abc")  # the batch's run carries the caller's labels
    assert page.status_code == 200 and "mutants seen: 0 of 3" in page.text and "(3 not finished)" in page.text
    finish(settings, run_id, {"batch_row_shift": (QUESTIONS[:20], PROMPTS[3:]), "softmax_scale_drift": ([], [])},
           dead=["split_lse_merge"])  # fmt: skip
    got = client.get("/api/v1/releases/git_sha=abc")
    assert got.status_code == 200, got.text
    [row] = [r for r in got.json()["profiles"] if r["profile"] == PROFILE]
    # A dead engine is seen too: the bug crashed the server.
    assert {k: row["mutation"][k] for k in ("caught", "judged", "mutants")} == {"caught": 2, "judged": 3, "mutants": 3}
    page = client.get("/releases/git_sha=abc")
    assert page.status_code == 200 and "mutants seen: 2 of 3" in page.text and "not finished" not in page.text
    notes = release_markdown(ReleaseSummary.model_validate(got.json()))
    assert f"- {PROFILE}: 2 of 3 kernel mutants seen (3 finished" in notes


def test_the_served_cpu_profile_chunks_every_prompt_and_never_splits_decode() -> None:
    """drift-tiny-cpu-triton, the served CPU path's mutation matrix (docs/mutants.md): every prompt
    is longer than one step's token budget, so its later chunks start with context
    (chunk_context_skip's condition), and no sequence comes near the keys from which unified
    decode splits, so split_lse_merge's merge never runs there (its row is a pass by construction)."""
    from tokenizers import Tokenizer

    from evals.fixtures.gsm8k_data import DATA_DIR
    from evals.suites.drift import DriftConfig, _gsm8k_texts
    from kernels.unified_attention import _default_launch

    profile = configured_profiles(Settings(profiles_dir=PACKAGED_PROFILES))["drift-tiny-cpu-triton"]
    assert profile.kernels.cpu_path == "triton-interpreter" and profile.engine.dtype == "float32"
    [entry] = profile.suites
    config = entry.config()
    assert isinstance(config, DriftConfig) and not config.edge_lengths
    # The served checkpoint's tokenizer, read without importing transformers (evals.fixtures.gsm8k_model does)
    tokenizer = Tokenizer.from_file(str(DATA_DIR / "gsm8k-tiny" / "tokenizer.json"))
    lengths = [len(tokenizer.encode(text).ids) for _key, text in _gsm8k_texts(config)]
    budget = profile.engine.max_num_batched_tokens
    assert budget is not None and len(lengths) == config.limit
    assert min(lengths) > budget + 1, (lengths, budget)  # a second chunk of more than one token, with context
    longest = max(lengths) + config.max_tokens + 1  # the teacher-forced pass's sequence
    assert _default_launch(True, 4, longest, 8).num_splits == 1, longest
