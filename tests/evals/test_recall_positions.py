"""The recall fixture's prompts put the key where asked, the sweep puts it on every cut, and
the report counts misreads per position and arm; the paired judgement comes from the accuracy kind."""

from __future__ import annotations

import random

import pytest

from evals.fixtures import retrieval_data as data
from evals.fixtures.retrieval_data import last_position
from evals.kinds.accuracy import KIND as ACCURACY
from evals.recall_positions import Cuts, misreads, plan, split_cuts, table
from evals.suites import get
from evals.suites.base import Sample
from evals.suites.recall import RecallConfig, items, recall_prompt, score
from evals.verdict import judge_ab


def test_the_tokenizer_reads_each_word_as_one_token_with_no_bos() -> None:
    tokenizer = data.build_tokenizer()
    recall = data.prompt(300, 123, seed=5)
    ids = tokenizer(recall.text)["input_ids"]
    assert ids == data.token_ids(recall.words) and len(ids) == 300
    assert tokenizer.decode(data.token_ids(recall.answer[:-1])) == " ".join(recall.answer[:-1])


@pytest.mark.parametrize(("length", "position"), [(5, 0), (64, 15), (64, 16), (481, 476), (8192, 4095), (8192, 4096)])
def test_the_answer_is_copied_from_exactly_the_asked_position(length: int, position: int) -> None:
    recall = data.prompt(length, position, seed=position)
    assert len(recall.words) == length and recall.words[-1] == data.QUERY
    assert recall.words[position : position + data.ANSWER_WORDS] == recall.answer[: data.ANSWER_WORDS]
    assert recall.answer[-1] == data.EOS
    for cls, word in zip(data.CLASSES, recall.answer, strict=False):  # one symbol of each class: one key to read
        assert word.startswith(cls) and [w for w in recall.words if w[0] == cls and w in data.SYMBOLS] == [word]
    others = [w for w in recall.words if w in data.SYMBOLS and w not in recall.answer]
    assert all(w.startswith(data.DISTRACTOR) for w in others) and (length < 64 or len(others) == 6)


def test_a_needle_that_cannot_fit_is_refused_with_the_bounds() -> None:
    with pytest.raises(ValueError, match="length - 5"):
        data.prompt(64, 60, seed=0)
    with pytest.raises(ValueError, match="length >= 5"):
        data.prompt(4, 0, seed=0)


def test_training_rows_mark_only_the_answers() -> None:
    for seed in range(20):
        words, mask = data.training_sequence(random.Random(seed), 200)
        marked = [w for w, m in zip(words, mask, strict=True) if m]
        query = words.index(data.QUERY)
        assert marked == words[query + 1 :] and len(marked) == data.ANSWER_WORDS + 1 and marked[-1] == data.EOS
        assert all(words[:query].count(w) == 1 for w in marked[:-1])  # each answer word once in the haystack


def test_split_cuts_are_the_token_balanced_pieces() -> None:
    # 1,000 keys in 64-key tiles: 16 tiles, 3 pieces of 6, 5, 5 tiles
    assert split_cuts(1000, 3, 64) == [6 * 64, 11 * 64]
    assert split_cuts(100, 8, 64) == []  # fewer tiles than pieces: no split


def test_the_sweep_puts_the_key_on_both_sides_of_every_kind_of_cut() -> None:
    cuts = Cuts(tiles=(16, 32, 64), pages=(16, 480), splits=(2, 4), chunks=(2048,))
    found = plan([8192], cuts, per_kind=3, repeats=3)
    positions = {item.position for item in found}
    for size in (16, 32, 64, 480, 2048):
        assert {size - 1, size} <= positions  # the first cut of each size, both sides
        last = (last_position(8192) // size) * size
        assert {last - 1, last} <= positions  # and the last inside the prompt
    assert {4095, 4096} <= positions  # the two-piece split of 8,192 keys
    assert {0, last_position(8192)} <= positions
    by_position = {item.position: item.cuts for item in found}
    assert "first of page480" in by_position[480] and "last of tile64" in by_position[4095]
    assert all(sum(1 for i in found if i.position == p) == 3 for p in positions)


def test_items_leave_out_lengths_past_the_servers_context() -> None:
    config = RecallConfig(lengths=[5, 64, 2048], per_kind=1, repeats=1)
    assert {item.length for item in items(config, 2048)} == {5, 64}
    assert len(items(config.model_copy(update={"limit": 2}), 4096)) == 2


def _samples(wrong_at: dict[tuple[int, int], int], repeats: int = 3) -> dict[str, Sample]:
    """Stored samples of a sweep at 64 and 8,192 words where `wrong_at[(length, position)]` prompts misread."""
    config = RecallConfig(lengths=[64, 8192], tiles=[64], pages=[], splits=[2], chunks=[], per_kind=1, repeats=repeats)
    found = {}
    for item in items(config, 10**6):
        recall = recall_prompt(item, 0)
        values = data.token_ids(recall.answer[: data.ANSWER_WORDS])
        if item.repeat < wrong_at.get((item.length, item.position), 0):
            values = [values[0], values[0], *values[2:]]  # the second answer word misread
        found[item.key] = score(item, recall, values)
    return found


def test_the_report_names_each_misread_position_per_arm() -> None:
    control = _samples({})
    mutant = _samples({(8192, 4095): 3, (8192, 4096): 1})
    rows = {arm: [s.data["recall"] for s in samples.values()] for arm, samples in
            {"fixed": control, "split_lse_merge": mutant}.items()}  # fmt: skip
    counted = misreads(rows["split_lse_merge"])
    assert counted[(8192, 4095)].sentence() == "key 4,095 of 8,192 misread in 3 of 3 prompts"
    assert counted[(8192, 4096)].wrong == 1 and counted[(64, 0)].wrong == 0
    printed = table(rows)
    assert "| 8,192 | 4,095 |" in printed and "| 0/3 | 3/3 |" in printed
    assert "| 64 |" not in printed  # positions no arm misread stay out
    assert "split_lse_merge: 2 of" in printed and "first: key 4,095 of 8,192 misread in 3 of 3 prompts" in printed
    assert "fixed: 0 of" in printed
    first_wrong = {s.data["recall"]["first_wrong"] for s in mutant.values()}
    assert first_wrong == {None, 1}  # the answer word that went wrong: the one reading position + 1


def test_paired_judgement_fails_a_mutant_that_misreads_keys_and_passes_the_control() -> None:
    control = ACCURACY.scores(_samples({}), "recall")
    mutant = ACCURACY.scores(_samples({(8192, 4095): 3, (8192, 4096): 3, (8192, 0): 3}), "recall")
    same = ACCURACY.scores(_samples({}), "recall")
    failed = judge_ab("recall", "recall", ACCURACY.judge, control, mutant, control_label="fixed")
    assert failed.verdict == "fail" and "9 right->wrong, 0 wrong->right" in failed.explanation
    assert judge_ab("recall", "recall", ACCURACY.judge, control, same, control_label="fixed").verdict != "fail"


def test_the_suite_is_registered_with_an_accuracy_metric() -> None:
    definition = get("recall")
    assert definition.metric_names() == ("recall",) and definition.kind_of("recall") is ACCURACY
    assert not definition.compares_outputs  # arms are paired by the accuracy kind, item by item


def test_the_drift_ladder_takes_recall_prompts_in_turn_and_runs_gsm8k_tokens_on() -> None:
    from evals.suites.drift import DriftConfig, recall_texts, run_on

    texts = recall_texts(DriftConfig(source="recall", ladder=[64, 3, 1024], limit=5))
    assert [len(text.split()) for _key, text in texts] == [64, 1024, 64, 1024, 64]  # too short: left out
    assert all(text.endswith(data.QUERY) for _key, text in texts)
    assert len(recall_texts(DriftConfig(source="recall", ladder=[64, 128], limit=1))) == 2  # one a length at least
    assert run_on([1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1] and run_on([], 4) == []
    with pytest.raises(ValueError, match="ladder lengths of at least 5"):
        recall_texts(DriftConfig(source="recall", ladder=[4]))
