"""The drift suite: do the candidate kernels change what the model computes, token by token?

It runs once per arm on the same prompts. The first arm (or a run with no reference) is the
reference: it generates greedily with `logprobs=k`, scores its own prompt + continuation
teacher-forced with `prompt_logprobs=k`, and does both again in another batch composition
(`floor_concurrency`, shuffled order) to measure the A/A floor, the engine's own
nondeterminism. A later arm (`context.reference_samples`: the first arm of an A/B run, or the
promoted reference run's stored samples) is the candidate: it generates the same way, scores
the reference's sequences teacher-forced, and every prompt stores both arms' tokens and
logprobs with the comparison (`evals.logprob_drift`). The verdict comes from the metric kind
`DRIFT` (`evals.kinds.drift`; the rule, every path against its own floor and margin, in
`evals.drift_verdict`).

Prompts are GSM8k few-shot prompts plus edge lengths: prompts whose token count puts
`seq_len mod block_size` at 0, 1 and block_size - 1 at the end of prefill, and one whose
decode crosses a block boundary mid-generation (steps at block_size - 1, 0, 1), because
kernel bugs live on those edges. The block size is the engine's own (its
`vllm:cache_config_info` metric) unless the config names one; lengths come from the
server's tokenizer. A prompt's sample is stored as soon as it is complete (a candidate's after
its one pass, a reference's after its second), progress counts passes, and an attempt after an
interruption reuses every stored sample of the same prompt and role (a candidate's only when
it was compared with the same reference output).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field

from evals import fixtures, pool
from evals.drift_verdict import DEFAULT_DLOGPROB_MARGIN, DEFAULT_KL_MARGIN, DEFAULT_TAIL_MARGIN, kl_value
from evals.fixtures import retrieval_data
from evals.kinds.drift import KIND as DRIFT
from evals.kinds.drift import NOT_FINITE
from evals.logprob_drift import ArmOutput, PromptDrift, compare, pack, unpack
from evals.records import MetricValue, Sample
from evals.suites.base import MetricSpec, SuiteConfig, SuiteContext, SuiteDefinition, SuiteOutcome
from evals.suites.logprob_client import Client

NAME = "drift"
METRIC = "kl"


class DriftConfig(SuiteConfig):
    """`limit` prompts of the `source` plus the edge-length prompts and the length `ladder`.

    `source` "gsm8k": few-shot GSM8k prompts from local JSONL files, and each `ladder` length (in
    tokens) one prompt of the GSM8k prompts' tokens run on to that length. "recall": the
    retrieval fixture's associative-recall prompts (`evals.fixtures.retrieval_data`, a model with
    its word-level tokenizer), `limit` of them over the `ladder` lengths in turn, needles spread
    over each prompt. Ladder lengths past the model's context are left out.
    """

    limit: int | None = Field(32, ge=1)
    source: Literal["gsm8k", "recall"] = "gsm8k"
    ladder: list[int] = Field(default_factory=list)
    questions_file: Path = Path("fixture:gsm8k-test.jsonl")
    fewshot_file: Path = Path("fixture:gsm8k-fewshot.jsonl")
    num_fewshot: int = Field(5, ge=0)
    max_tokens: int = Field(64, ge=1)
    logprobs: int = Field(5, ge=1, le=20)
    concurrency: int = Field(8, ge=1)
    floor_concurrency: int = Field(2, ge=1)
    floor_seed: int = 0
    block_size: int | None = Field(None, ge=2)
    edge_lengths: bool = True
    kl_tolerance: float = Field(DEFAULT_KL_MARGIN, ge=0)  # the KL margin over the floor
    dlogprob_tolerance: float = Field(DEFAULT_DLOGPROB_MARGIN, ge=0)  # the decode |delta logprob| margin
    tail_tolerance: float = Field(DEFAULT_TAIL_MARGIN, ge=0)  # the tail rule's margin over the floor's largest KL


@dataclass(frozen=True)
class Prompt:
    key: str
    text: str
    ids: list[int]
    shared: int  # leading tokens every prompt has (the few-shot header): positions there say nothing new


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A JSONL file, or a `fixture:` one (the defaults name the committed GSM8k fixture files)."""
    found = Path(fixtures.resolve(str(path)))
    return [json.loads(line) for line in found.read_text().splitlines() if line.strip()]


def _head(config: DriftConfig) -> str:
    """The few-shot header every GSM8k prompt starts with."""
    shots = _read_jsonl(config.fewshot_file)[: config.num_fewshot]
    return "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)


def _gsm8k_texts(config: DriftConfig) -> list[tuple[str, str]]:
    head = _head(config)
    items = _read_jsonl(config.questions_file)[: config.limit]
    return [(f"gsm8k-{i:04d}", f"{head}Question: {item['question']}\nAnswer:") for i, item in enumerate(items)]


def recall_texts(config: DriftConfig) -> list[tuple[str, str]]:
    """`limit` recall prompts (at least one a ladder length), lengths taken in turn, each needle at
    a seeded place between the prompt's start and end."""
    lengths = sorted(n for n in config.ladder if n >= retrieval_data.MIN_LENGTH)
    if not lengths:
        raise ValueError(f"drift: source recall needs ladder lengths of at least {retrieval_data.MIN_LENGTH} tokens")
    rng = random.Random(config.floor_seed)
    found = []
    for i in range(max(config.limit or 0, len(lengths))):
        length = lengths[i % len(lengths)]
        position = rng.randint(0, retrieval_data.last_position(length))
        recall = retrieval_data.prompt(length, position, seed=rng.getrandbits(32))
        found.append((f"recall-{length:05d}-{i:03d}", recall.text))
    return found


def source_texts(config: DriftConfig) -> list[tuple[str, str]]:
    """(key, text) of each prompt of the configured source."""
    return recall_texts(config) if config.source == "recall" else _gsm8k_texts(config)


def run_on(ids: Sequence[int], length: int) -> list[int]:
    """`ids` repeated until `length` tokens: a ladder prompt made of a source's own tokens."""
    return [ids[i % len(ids)] for i in range(length)] if ids else []


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all `sequences` share."""
    if not sequences:
        return 0
    shortest = min(len(s) for s in sequences)
    return next((i for i in range(shortest) if len({s[i] for s in sequences}) > 1), shortest)


def fits(prompt_tokens: int, max_tokens: int, max_len: int) -> bool:
    """Whether both passes fit the model: the teacher-forced one sends prompt + continuation
    (up to `max_tokens`) as a prompt and asks for one more token."""
    return prompt_tokens + max_tokens + 1 <= max_len


def edge_lengths(block_size: int, max_tokens: int, max_len: int) -> dict[str, int]:
    """Prompt token counts that put seq_len mod block_size on the edges, by what they probe;
    those too long for the model are left out."""
    lengths = {
        "prefill-mod0": 2 * block_size,
        "prefill-mod1": 2 * block_size + 1,
        f"prefill-mod{block_size - 1}": 3 * block_size - 1,
    }
    crossing = 3 * block_size - max(1, max_tokens // 2)  # decode steps reach mod B-1, 0, 1 mid-way
    if crossing > 0:
        lengths["decode-cross"] = crossing
    return {key: n for key, n in lengths.items() if fits(n, max_tokens, max_len)}


async def source_prompts(client: Client, config: DriftConfig) -> tuple[list[Prompt], int]:
    """The source's prompts, tokenized by the server, and (GSM8k) the ladder's run-on prompts;
    each knows how many leading tokens all share (the few-shot header's, as the server splits
    them). Also the server's context length (0: not reported)."""
    texts = source_texts(config)
    head_ids = (await client.tokenize(_head(config)))[0] if config.source == "gsm8k" else []
    ids_of: list[tuple[str, str, list[int]]] = []
    max_len = 0
    for key, text in texts:
        ids, max_len = await client.tokenize(text)
        if max_len and not fits(len(ids), config.max_tokens, max_len) and config.source == "recall":
            continue  # a ladder length past the model's context
        if max_len and not fits(len(ids), config.max_tokens, max_len):
            raise ValueError(
                f"drift: prompt {key} has {len(ids)} tokens; with max_tokens {config.max_tokens} the teacher-forced "
                f"pass needs {len(ids) + config.max_tokens + 1} > {max_len} positions; lower num_fewshot or max_tokens"
            )
        ids_of.append((key, text, ids))
    shared = common_prefix([head_ids, *(ids for _key, _text, ids in ids_of)])
    prompts = [Prompt(key, text, ids, shared) for key, text, ids in ids_of]
    if config.source == "gsm8k":
        every = [token for p in prompts for token in p.ids]
        for length in sorted(set(config.ladder)):
            if not max_len or fits(length, config.max_tokens, max_len):
                text = f"<{length} tokens of the GSM8k prompts>"
                prompts.append(Prompt(f"ladder-{length:05d}", text, run_on(every, length), min(shared, length)))
    return prompts, max_len


async def _prompts(client: Client, config: DriftConfig) -> list[Prompt]:
    """The source's prompts, the ladder and the edge lengths (`source_prompts`)."""
    prompts, max_len = await source_prompts(client, config)
    shared = prompts[0].shared if prompts else 0
    if config.edge_lengths and prompts:
        block = await client.block_size()
        filler = [token for p in prompts for token in p.ids]
        for key, length in edge_lengths(block, config.max_tokens, max_len or 10**9).items():
            if length <= len(filler):
                ids = filler[:length]
                text = f"<{length} tokens, block size {block}>"
                prompts.append(Prompt(f"edge-{key}-{length}", text, ids, min(shared, length)))
    return prompts


class _Passes:
    """Counts finished prompt passes for the run's progress."""

    def __init__(self, context: SuiteContext, total: int, done: int) -> None:
        self.context, self.total, self.done = context, total, done
        context.progress(done, total)

    def step(self) -> None:
        self.done += 1
        self.context.progress(self.done, self.total)


async def _run_arm(
    client: Client,
    prompts: Sequence[Prompt],
    concurrency: int,
    forced: Mapping[str, list[int]],
    finished: Callable[[Prompt, ArmOutput], None],
) -> dict[str, ArmOutput]:
    """Each prompt's greedy output and its teacher-forced scores of `forced[key]` (or its own
    sequence); `finished` hears of each prompt as it completes."""
    outputs: dict[str, ArmOutput] = {}

    async def one(prompt: Prompt) -> None:
        tokens, logprobs, top = await client.generate(prompt.ids)
        sequence = forced.get(prompt.key) or [*prompt.ids, *tokens]
        prefill_top, prefill_own = await client.score(sequence)
        outputs[prompt.key] = ArmOutput(tokens, logprobs, top, prefill_top, prefill_own)
        finished(prompt, outputs[prompt.key])

    await pool.each(prompts, concurrency, one)
    return outputs


def _prompt_hash(ids: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


def _reusable(earlier: Sample, prompt: Prompt, reference: Mapping[str, Any] | None) -> bool:
    """An earlier attempt's sample of the same prompt in the same role (and against the same
    reference output, for a candidate)."""
    if earlier.prompt_hash != _prompt_hash(prompt.ids) or not earlier.data.get("arm"):
        return False
    if reference is None:
        return earlier.data.get("drift") is None and "reference" not in earlier.data
    return earlier.data.get("drift") is not None and earlier.data.get("reference") == reference["arm"]


def _sample(
    prompt: Prompt,
    mine: ArmOutput,
    floor: PromptDrift,
    drift: PromptDrift | None,
    reference: ArmOutput | None,
    config: DriftConfig,
    again: ArmOutput | None = None,
    change: Mapping[str, Any] | None = None,
) -> Sample:
    """A reference's sample keeps its second pass (`again`) and a candidate's the reference's
    output, so that a changed rule can re-compare stored runs, and what its engine changed
    (`SuiteContext.engine_change`)."""
    finite = floor.finite if drift is None else drift.finite
    data: dict[str, Any] = {
        "prompt_ids": prompt.ids,
        "shared": prompt.shared,
        "arm": pack(mine),
        "floor": floor.as_dict(),
        "drift": drift.as_dict() if drift is not None else None,
        "finite": finite,
        "kl_tolerance": config.kl_tolerance,
        "dlogprob_tolerance": config.dlogprob_tolerance,
        "tail_tolerance": config.tail_tolerance,
    }
    if reference is not None:
        data["reference"] = pack(reference)
        data["engine_change"] = dict(change) if change is not None else None
    if again is not None:
        data["floor_arm"] = pack(again)
    diverged = drift.first_divergence if drift is not None else None
    return Sample(
        key=prompt.key,
        prompt_hash=_prompt_hash(prompt.ids),
        prompt=prompt.text,
        target="",
        response=f"{len(mine.tokens)} tokens" + ("" if diverged is None else f", first divergence at {diverged}"),
        data=data,
        error=None if finite else "non-finite logprobs",
    )


def recompare(candidate: Sample, reference: Sample) -> Sample:
    """`candidate` with its floor and drift rows computed again by today's `compare` from the
    stored outputs (the reference's two passes, the candidate's own and the reference's output),
    for re-judging stored runs under a changed rule."""
    ref, cand = candidate.data["reference"], candidate.data["arm"]
    shared, length = int(candidate.data["shared"]), len(candidate.data["prompt_ids"])
    floor = compare(unpack(reference.data["arm"]), unpack(reference.data["floor_arm"]), shared, length)
    drift = compare(unpack(ref), unpack(cand), shared, length)
    return replace(candidate, data={**candidate.data, "floor": floor.as_dict(), "drift": drift.as_dict()})


async def _run(context: SuiteContext) -> tuple[list[Sample], int]:
    """Every prompt's sample, in prompt order, and how many an earlier attempt had stored."""
    config: DriftConfig = context.config
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
    async with httpx.AsyncClient(timeout=config.request_timeout_s, limits=limits) as http:
        client = Client(context, http)
        prompts = await _prompts(client, config)
        references = {key: s.data for key, s in context.reference_samples.items() if s.data.get("arm")}
        missing = [p.key for p in prompts if p.key not in references]
        if references and missing:
            raise ValueError(
                f"drift: the reference stored no output for {len(missing)} prompts ({', '.join(missing[:5])}); "
                "run the candidate with the reference's drift config"
            )
        done: dict[str, Sample] = {}
        for prompt in prompts:
            earlier = context.done_samples.get(prompt.key)
            if earlier is not None and _reusable(earlier, prompt, references.get(prompt.key)):
                done[prompt.key] = earlier
        reused = len(done)
        todo = [p for p in prompts if p.key not in done]
        passes = 1 if references else 2
        progress = _Passes(context, passes * len(prompts), passes * reused)

        def keep(sample: Sample) -> None:
            context.emit_samples([sample])
            done[sample.key] = sample
            progress.step()

        if references:

            def compared(prompt: Prompt, mine: ArmOutput) -> None:
                data = references[prompt.key]
                ref, floor = unpack(data["arm"]), PromptDrift(**data["floor"])
                drift = compare(ref, mine, prompt.shared, len(prompt.ids))
                keep(_sample(prompt, mine, floor, drift, ref, config, change=context.engine_change))

            forced = {key: [*data["prompt_ids"], *data["arm"]["tokens"]] for key, data in references.items()}
            await _run_arm(client, todo, config.concurrency, forced, compared)
        elif todo:
            first = await _run_arm(client, todo, config.concurrency, {}, lambda _prompt, _out: progress.step())
            shuffled = list(todo)
            random.Random(config.floor_seed).shuffle(shuffled)

            def floored(prompt: Prompt, again: ArmOutput) -> None:
                floor = compare(first[prompt.key], again, prompt.shared, len(prompt.ids))
                keep(_sample(prompt, first[prompt.key], floor, None, None, config, again))

            forced = {p.key: [*p.ids, *first[p.key].tokens] for p in todo}
            await _run_arm(client, shuffled, config.floor_concurrency, forced, floored)
    return [done[p.key] for p in prompts], reused


def run(context: SuiteContext) -> SuiteOutcome:
    samples, reused = asyncio.run(_run(context))
    scores = DRIFT.scores({s.key: s for s in samples}, METRIC)
    value = kl_value([row["drift"] or row["floor"] for row in scores.values()])
    compared = any(row["drift"] is not None for row in scores.values())
    empty = sum(1 for s in samples if not s.data["arm"]["tokens"])
    n = len(samples)
    return SuiteOutcome(
        metrics=[MetricValue(name=METRIC, value=NOT_FINITE if value is None else value, n=n, direction="lower")],
        samples=samples,
        empty_response_rate=empty / len(samples) if samples else 1.0,
        details={"prompts": len(samples), "role": "candidate" if compared else "reference", "reused_samples": reused},
    )


DEFINITION = SuiteDefinition(
    name=NAME, config_model=DriftConfig, metrics=(MetricSpec(METRIC, DRIFT),), run=run, compares_outputs=True
)
