"""The suite contract: every suite declares its metrics with a kind, and readers ask the kind."""

from __future__ import annotations

import pytest

from evals import suites
from evals.kinds.accuracy import KIND as ACCURACY
from evals.kinds.wer import KIND as WER
from evals.records import Sample


def test_every_registered_suite_declares_a_kind_per_metric() -> None:
    declared = {name: {s.name: s.kind.name for s in d.metrics} for name, d in suites.registry().items()}
    assert declared == {
        "gsm8k": {"strict-match": "accuracy", "flexible-extract": "accuracy"},
        "wer": {"wer": "wer"},
        "drift": {"kl": "drift"},
        "invariance": {"kl": "invariance"},
        "recall": {"recall": "accuracy"},
        "lm-eval": {},  # its profile's config names the metrics; every one is of its open kind
    }
    assert suites.metric_kind("lm-eval", "gsm8k:exact_match,strict-match") is ACCURACY
    assert suites.metric_kind("wer", "wer").direction == "lower" and ACCURACY.direction == "higher"
    assert list(suites.get("gsm8k").kinds()) == [ACCURACY]
    with pytest.raises(KeyError, match="declares no metric 'exact'; it reports strict-match, flexible-extract"):
        suites.metric_kind("gsm8k", "exact")


def test_kinds_read_their_own_fields_only() -> None:
    item = Sample(key="q", prompt_hash="h", target="42", response="42", correct={"strict-match": False})
    utterance = Sample(
        key="u", prompt_hash="h", target="a b", response="a b",
        data={"wer": {"substitutions": 0, "deletions": 0, "insertions": 0, "ref_words": 2}},
    )  # fmt: skip
    assert ACCURACY.scores({"q": item, "u": utterance}, "strict-match") == {"q": False}
    assert WER.scores({"q": item, "u": utterance}, "wer") == {"u": (0, 2)}
    assert (ACCURACY.passed(item, "strict-match"), ACCURACY.passed(utterance, "strict-match")) == (False, None)
    assert (WER.passed(utterance, "wer"), WER.passed(item, "wer")) == (True, None)


@pytest.mark.parametrize("name", ["gsm8k", "wer", "drift", "lm-eval"])
@pytest.mark.parametrize("field", [{"limit": -3}, {"limit": 0}, {"concurrency": 0}, {"max_retries": -1}])
def test_every_suite_refuses_nonsense_limits(name: str, field: dict[str, int]) -> None:
    """A negative limit once sliced prompts off the end without a word; zero workers hang."""
    from pydantic import ValidationError

    model = suites.get(name).config_model
    required = {
        "lm-eval": {"tasks": [{"name": "gsm8k", "metrics": ["exact_match,strict-match"]}]},
        "wer": {"manifest": "clips.jsonl"},
    }.get(name, {})
    assert model.model_validate(required).limit != -3  # the rest of the block is valid as it is
    with pytest.raises(ValidationError) as refused:
        model.model_validate({**required, **field})
    assert [error["loc"] for error in refused.value.errors()] == [(next(iter(field)),)]
