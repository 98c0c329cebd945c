"""Run-to-run diffs on real `Sample` rows: what flipped, what changed most, what is left out."""

from __future__ import annotations

from evals.kinds.accuracy import correct_flags, diff_accuracy
from evals.kinds.wer import diff_wer, word_errors
from evals.records import Sample


def _answer(key: str, right: bool, response: str) -> Sample:
    return Sample(
        key=key,
        prompt_hash="h",
        target="42",
        response=response,
        extracted={"strict-match": response.split()[-1]},
        correct={"strict-match": right},
    )


def _utterance(key: str, errors: tuple[int, int, int] | None, hypothesis: str) -> Sample:
    counts = None if errors is None else dict(zip(("substitutions", "deletions", "insertions"), errors, strict=True))
    return Sample(
        key=key,
        prompt_hash="h",
        target="the cat sat on the mat",
        response=hypothesis,
        data={} if counts is None else {"wer": {**counts, "ref_words": 6}},
    )


def test_diff_accuracy_lists_flips_both_ways_with_both_responses() -> None:
    a = {
        "q1": _answer("q1", True, "so 42"),
        "q2": _answer("q2", False, "so 41"),
        "q3": _answer("q3", True, "so 42"),
        "q4": _answer("q4", True, "so 42"),
        "only-a": _answer("only-a", True, "so 42"),
    }
    b = {
        "q1": _answer("q1", False, "so NaN"),
        "q2": _answer("q2", True, "so 42"),
        "q3": _answer("q3", True, "so 42"),
        "q4": Sample(key="q4", prompt_hash="h", target="42", response="", error="timeout"),  # unscored
        "only-b": _answer("only-b", False, "so 0"),
    }
    diff = diff_accuracy(a, b, metric="strict-match")
    assert diff.matched == 3
    assert [f.key for f in diff.right_to_wrong] == ["q1"] and [f.key for f in diff.wrong_to_right] == ["q2"]
    down = diff.right_to_wrong[0]
    assert (down.response_a, down.response_b, down.extracted_a, down.extracted_b) == ("so 42", "so NaN", "42", "NaN")
    assert diff_accuracy(a, b, metric="flexible-extract").matched == 0


def test_diff_wer_orders_by_largest_change_and_caps_at_top() -> None:
    a = {
        "u1": _utterance("u1", (0, 0, 0), "the cat sat on the mat"),
        "u2": _utterance("u2", (1, 0, 0), "the bat sat on the mat"),
        "u3": _utterance("u3", (2, 1, 0), "a bat sat the mat"),
        "u4": _utterance("u4", (0, 0, 0), "the cat sat on the mat"),
        "u5": _utterance("u5", (0, 0, 0), "the cat sat on the mat"),
    }
    b = {
        "u1": _utterance("u1", (3, 0, 2), "! ! ! ! ! ! ! !"),  # +5
        "u2": _utterance("u2", (1, 0, 0), "the bat sat on the mat"),  # unchanged
        "u3": _utterance("u3", (0, 0, 0), "the cat sat on the mat"),  # -3
        "u4": _utterance("u4", (1, 0, 2), "the cat cat sat on on mat"),  # +3
        "u5": _utterance("u5", None, ""),  # unscored
    }
    diff = diff_wer(a, b)
    assert (diff.matched, diff.worse, diff.better) == (4, 2, 1)
    assert [(c.key, c.errors_a, c.errors_b) for c in diff.changes] == [("u1", 0, 5), ("u4", 0, 3), ("u3", 3, 0)]
    assert diff.changes[0].hypothesis_b == "! ! ! ! ! ! ! !" and diff.changes[0].target == "the cat sat on the mat"
    assert [c.key for c in diff_wer(a, b, top=1).changes] == ["u1"]


def test_score_extraction_feeds_verdicts_and_skips_unscored_rows() -> None:
    rows = {"q1": _answer("q1", True, "so 42"), "q2": Sample(key="q2", prompt_hash="h", target="42", response="")}
    assert correct_flags(rows, "strict-match") == {"q1": True}
    utterances = {"u1": _utterance("u1", (1, 2, 3), "x"), "u2": _utterance("u2", None, "")}
    assert word_errors(utterances) == {"u1": (6, 6)}
