"""The synthetic GSM8k problems: schema, arithmetic, mix, held-out separation, committed files."""

from __future__ import annotations

import re
from collections import Counter

from evals.fixtures import gsm8k_data

# The stock lm-eval gsm8k task's strict-match pattern.
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
CALC = re.compile(r"<<(\d+)([+\-*])(\d+)=(\d+)>>\4")
APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def test_committed_files_are_what_the_generator_writes() -> None:
    assert gsm8k_data.read_jsonl(gsm8k_data.TEST_FILE) == [p.as_record() for p in gsm8k_data.held_out_split()]
    assert gsm8k_data.read_jsonl(gsm8k_data.FEWSHOT_FILE) == [p.as_record() for p in gsm8k_data.fewshot_split()]


def test_generation_is_deterministic_per_seed() -> None:
    assert gsm8k_data.generate(20, seed=5) == gsm8k_data.generate(20, seed=5)
    assert gsm8k_data.generate(20, seed=5) != gsm8k_data.generate(20, seed=6)


def test_answers_follow_gsm8k_schema_and_arithmetic_is_right() -> None:
    problems = gsm8k_data.held_out_split() + gsm8k_data.fewshot_split()
    for problem in problems:
        assert set(problem.as_record()) == {"question", "answer"}
        reasoning, final = problem.answer.rsplit("\n", 1)
        assert STRICT.fullmatch(final) and int(final.removeprefix("#### ")) == problem.result
        calc = CALC.search(reasoning)
        assert calc is not None, reasoning
        a, op, b, c = calc.groups()
        assert APPLY[op](int(a), int(b)) == int(c) == problem.result
        assert problem.result > 0


def test_operation_mix_is_40_40_20() -> None:
    problems = gsm8k_data.held_out_split()
    ops = Counter(CALC.search(p.answer).group(2) for p in problems)  # type: ignore[union-attr]
    shares = {op: ops[op] / len(problems) for op in "+-*"}
    assert abs(shares["+"] - 0.4) < 0.08 and abs(shares["-"] - 0.4) < 0.08 and abs(shares["*"] - 0.2) < 0.06


def test_held_out_questions_are_unique_and_never_trained_on() -> None:
    held_out = [p.question for p in gsm8k_data.held_out_split()]
    assert len(held_out) == gsm8k_data.TEST_SIZE == len(set(held_out))
    assert not set(held_out) & {p.question for p in gsm8k_data.fewshot_split()}
    stream = gsm8k_data.training_problems(seed=0)
    assert not set(held_out) & {next(stream).question for _ in range(5000)}
