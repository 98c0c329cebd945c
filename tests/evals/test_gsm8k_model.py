"""The committed GSM8k fixture checkpoint and its tokenizer, as vLLM will load them."""

from __future__ import annotations

import json

from safetensors import safe_open
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from evals.fixtures import gsm8k_data, gsm8k_model


def test_checkpoint_is_a_small_bf16_llama_with_head_dim_64() -> None:
    folder = gsm8k_model.model_dir()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["head_dim"]) == (4, 256, 64)
    assert config["dtype"] == "bfloat16"
    weights = folder / "model.safetensors"
    assert weights.stat().st_size < 12_000_000
    with safe_open(str(weights), framework="pt") as handle:
        assert {str(handle.get_slice(name).get_dtype()) for name in handle.keys()} == {"BF16"}  # noqa: SIM118


def test_tokenizer_splits_digits_and_round_trips_prompts() -> None:
    tokenizer = AutoTokenizer.from_pretrained(gsm8k_model.model_dir())
    assert all(sum(ch.isdigit() for ch in token) <= 1 for token in tokenizer.get_vocab())
    assert [t for t in tokenizer.tokenize("1234") if t.strip("Ġ")] == ["1", "2", "3", "4"]
    record = gsm8k_data.read_jsonl(gsm8k_data.TEST_FILE)[0]
    text = "".join(gsm8k_model.block(record["question"], record["answer"])) + "Question:"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_loss_covers_answers_and_the_stop_but_not_questions() -> None:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(gsm8k_model.model_dir())
    problems = gsm8k_data.held_out_split()[:2]
    ids, trained = gsm8k_model.encode_sequence(tokenizer, problems)
    trained_text = tokenizer.decode([i for i, t in zip(ids, trained, strict=True) if t])
    expected = "".join(f" {p.answer}\n\nQuestion:" for p in problems)
    assert trained_text == expected
