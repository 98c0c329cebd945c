"""A database a release manager would recognise, written through the ORM and the run store.

Verdicts and explanations are computed by `evals.verdict` from per-item rows, as scoring
does, so the pages show real sentences. Two runs hold a known flip each way on GSM8k
(`FLIP_DOWN` right->wrong, `FLIP_UP` wrong->right); two Whisper runs one utterance that
got worse (`WORSE_UTTERANCE`); one run is mid-way (10/100) and one is queued.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from evals import suites
from evals.kinds.accuracy import judge_accuracy
from evals.kinds.wer import judge_wer
from evals.records import MetricValue, Sample
from evals.verdict import Baseline, MetricJudgement, run_verdict
from service.db.models import Baseline as BaselineRow
from service.db.models import Run, utcnow
from service.db.session import session_scope
from service.runs import store

GSM8K = "kimi-linear-48b-a3b"
WHISPER = "whisper-large-v3"
FILLER = "llama-3.1-8b"
STRICT = "strict-match"
FLEX = "flexible-extract"
FLIP_DOWN = "gsm8k-0003"
FLIP_UP = "gsm8k-0016"
WORSE_UTTERANCE = "utt-0007"
GSM8K_BASELINE = Baseline(0.8711, "higher", "absolute", 0.08, "vLLM PR #47671, Kimi-Linear-48B-A3B, TRITON_MLA, GB200")
FLEX_BASELINE = Baseline(0.8795, "higher", "absolute", 0.08, "vLLM PR #47671 (flexible-extract)")
WER_BASELINE = Baseline(0.045, "lower", "relative", 0.1, "whisper-large-v3 on LibriSpeech test-clean, H100")
# Profiles the service loads (the filler profile is left out: a profile no longer configured).
PROFILES = {
    GSM8K: (
        "description: Kimi-Linear-48B-A3B on TRITON_MLA, GSM8k 5-shot\n"
        "model: moonshotai/Kimi-Linear-48B-A3B-Instruct\nserved_model_name: kimi\n"
        "engine: {attention_backend: TRITON_MLA, tensor_parallel_size: 4}\nsuites: [{suite: gsm8k}]\n"
    ),
    WHISPER: (
        "description: Whisper large-v3 on TRITON_ATTN, WER on LibriSpeech test-clean\n"
        "model: openai/whisper-large-v3\nserved_model_name: whisper-large-v3\n"
        "suites: [{suite: wer, hub_path: openslr/librispeech_asr}]\n"
    ),
}
FILLER_RUNS = 80
GSM8K_HISTORY = 24
COLLAPSE_INDEX = 17  # the nightly that lost 25 points: a red point on the chart
WER_HISTORY = 8
ITEMS = 200
UTTERANCES = 30


@dataclass
class Seeded:
    reference: int = 0
    candidate: int = 0
    collapse: int = 0
    wer_reference: int = 0
    wer_candidate: int = 0
    errored: int = 0
    running: int = 0
    queued: int = 0
    gsm8k_points: list[int] = field(default_factory=list)
    total_runs: int = 0


def _engine(arm: str) -> dict[str, object]:
    receipt = {
        "pid": 4242,
        "role": "engine_core",
        "platform": "cuda",
        "device_name": "NVIDIA GB200",
        "vllm_version": "0.24.0",
        "variant": arm,
        "routes_through_swapped": True,
        "swapped": [
            {
                "target": "vllm.attention.ops.triton_unified_attention.unified_attention",
                "from": "vllm (stock)",
                "to": "kernels.unified_attention.unified_attention",
            }
        ],
    }
    return {
        arm: {
            "version": "0.24.0",
            "models": [  # an entry of vLLM's /v1/models answer, as the launcher records it
                {
                    "id": GSM8K,
                    "object": "model",
                    "owned_by": "vllm",
                    "root": "/models/gsm8k-tiny",
                    "parent": None,
                    "max_model_len": 2048,
                    "permission": [{"id": "modelperm-1", "allow_sampling": True}],
                }
            ],
            "url": "http://127.0.0.1:41000",
            "startup_s": 84.2,
            "receipts": [receipt],
            "gpu": "NVIDIA GB200",
        }
    }


def _finished(profile: str, at: datetime, trigger: str, sha: str, minutes: float) -> Run:
    return Run(
        profile=profile,
        status="passed",
        trigger=trigger,
        triggered_by="github-actions" if trigger == "ci" else "scheduler",
        triggered_role="ci" if trigger == "ci" else "scheduler",
        labels={"git_sha": sha, "vllm_version": "0.24.0", "build_url": f"https://ci.example.com/build/{sha}"},
        created_at=at,
        started_at=at + timedelta(seconds=20),
        finished_at=at + timedelta(seconds=20, minutes=minutes),
        attempt=1,
        engine=_engine("fixed"),
        timings={"fixed.engine_start_s": 84.2, "fixed.gsm8k_s": 60 * minutes - 90},
        log_tail="INFO engine started\nINFO 1319 requests done\nINFO shutting down\n",
    )


def _question(i: int) -> str:
    few_shot = "".join(
        f"Question: How many apples do {n} baskets of 3 apples hold?\nAnswer: {n} * 3 = {3 * n}. #### {3 * n}\n\n"
        for n in (2, 5)
    )
    return few_shot + f"Question: Tom has {i} marbles and buys {i + 7} more. How many does he have?\nAnswer:"


def _answer(i: int, right: bool) -> Sample:
    target = str(2 * i + 7)
    said = target if right else str(2 * i + 6)
    return Sample(
        key=f"gsm8k-{i:04d}",
        prompt_hash=f"p{i:04d}",
        prompt=_question(i),
        target=target,
        response=f"Tom has {i} + {i + 7} = {said} marbles. The answer is {said}.",
        extracted={STRICT: said, FLEX: said},
        correct={STRICT: right, FLEX: right},
    )


# Twelve words that Whisper's normaliser leaves as they are, so the page's marks match S/D/I.
SPOKEN = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "near", "the", "river"]


def _utterance(i: int, errors: int) -> Sample:
    words = len(SPOKEN)
    reference = " ".join(SPOKEN)
    hypothesis = " ".join(word if w >= errors else "mistake" for w, word in enumerate(SPOKEN))
    return Sample(
        key=f"utt-{i:04d}",
        prompt_hash=f"a{i:04d}",
        target=reference,
        response=hypothesis,
        data={"wer": {"substitutions": errors, "deletions": 0, "insertions": 0, "ref_words": words}},
    )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _store(
    session: Session, run: Run, suite: str, judgement: MetricJudgement, direction: str, arm: str = "fixed"
) -> None:
    """The result row scoring would write for this judgement."""
    details = judgement.details
    metric = MetricValue(
        name=judgement.metric,
        value=judgement.value,
        n=judgement.n,
        stderr=_number(details.get("stderr")),
        ci_low=_number(details.get("ci_low")),
        ci_high=_number(details.get("ci_high")),
        direction=direction,
    )
    store.save_result(session, run, arm, suite, metric, 0.0, judgement)


def _conclude(run: Run, judgements: list[MetricJudgement]) -> None:
    run.verdict = run_verdict(judgements)
    run.status = "failed" if run.verdict == "fail" else "passed"
    run.verdict_summary = f"{run.verdict}: " + "; ".join(
        f"{j.suite}.{j.metric} {suites.shown(j.suite, j.metric, j.value, j.details)}: {j.verdict}" for j in judgements
    )


def seed(database_url: str) -> Seeded:
    rng = random.Random(7)
    seeded = Seeded()
    start = utcnow() - timedelta(days=60)
    with session_scope(database_url) as session:
        for profile, suite, metric, baseline in (
            (GSM8K, "gsm8k", STRICT, GSM8K_BASELINE),
            (GSM8K, "gsm8k", FLEX, FLEX_BASELINE),
            (WHISPER, "wer", "wer", WER_BASELINE),
        ):
            session.add(
                BaselineRow(
                    profile=profile,
                    suite=suite,
                    metric=metric,
                    value=baseline.value,
                    direction=baseline.direction,
                    tolerance_kind=baseline.tolerance_kind,
                    tolerance=baseline.tolerance,
                    source=baseline.source,
                    updated_by="profile",
                )
            )
        for i in range(FILLER_RUNS):
            run = _finished(FILLER, start + timedelta(hours=6 * i), "ci", f"f{i:06x}", 30)
            run.verdict, run.verdict_summary = "pass", "pass: gsm8k.strict-match 0.7900: pass"
            session.add(run)
        session.flush()

        base_sample = {f"gsm8k-{i:04d}": _answer(i, right=i % 8 != 0) for i in range(ITEMS)}
        reference_flags = {k: s.correct[STRICT] for k, s in base_sample.items()}
        history_start = start + timedelta(days=25)
        wer_every = GSM8K_HISTORY // WER_HISTORY
        for day in range(GSM8K_HISTORY):
            at = history_start + timedelta(days=day)
            run = _finished(GSM8K, at, "nightly" if day % 2 else "ci", f"{0xA000 + day:07x}", 95)
            session.add(run)
            session.flush()
            judgements = []
            if day == 2 or day == GSM8K_HISTORY - 1:
                flips = {FLIP_DOWN: False, FLIP_UP: True} if day == GSM8K_HISTORY - 1 else {}
                samples = [_answer(int(k[-4:]), flips.get(k, s.correct[STRICT])) for k, s in base_sample.items()]
                store.save_samples(session, run.id, "fixed", "gsm8k", STRICT, samples)
                flags = {s.key: s.correct[STRICT] for s in samples}
                paired = reference_flags if day != 2 else None
                for metric, baseline in ((STRICT, GSM8K_BASELINE), (FLEX, FLEX_BASELINE)):
                    judgements.append(judge_accuracy("gsm8k", metric, flags, baseline, paired))
            else:
                rate = 0.62 if day == COLLAPSE_INDEX else 0.87 + rng.uniform(-0.012, 0.012)
                n = 1319
                flags = {f"g{i}": i < round(rate * n) for i in range(n)}
                judgements.append(judge_accuracy("gsm8k", STRICT, flags, GSM8K_BASELINE))
                judgements.append(
                    judge_accuracy("gsm8k", FLEX, {k: v for k, v in list(flags.items())[5:]}, FLEX_BASELINE)
                )
            for judgement in judgements:
                _store(session, run, "gsm8k", judgement, "higher")
            _conclude(run, judgements)
            seeded.gsm8k_points.append(run.id)
            if day == 2:
                seeded.reference = run.id
            if day == COLLAPSE_INDEX:
                seeded.collapse = run.id
            seeded.candidate = run.id

            if day % wer_every == 0:
                wer_run = _finished(WHISPER, at + timedelta(hours=2), "nightly", f"{0xB000 + day:07x}", 25)
                session.add(wer_run)
                session.flush()
                worse = day == (WER_HISTORY - 1) * wer_every
                errors = [1 if i % 3 == 0 else 0 for i in range(UTTERANCES)]
                if worse:
                    errors[int(WORSE_UTTERANCE[-4:])] = 6
                utterances = [_utterance(i, e) for i, e in enumerate(errors)]
                store.save_samples(session, wer_run.id, "fixed", "wer", "wer", utterances)
                counts = {u.key: (u.data["wer"]["substitutions"], u.data["wer"]["ref_words"]) for u in utterances}
                judgement = judge_wer("wer", "wer", counts, WER_BASELINE)
                _store(session, wer_run, "wer", judgement, "lower")
                _conclude(wer_run, [judgement])
                if day == 0:
                    seeded.wer_reference = wer_run.id
                seeded.wer_candidate = wer_run.id

        for profile, reference in ((GSM8K, seeded.reference), (WHISPER, seeded.wer_reference)):
            session.execute(
                update(BaselineRow).where(BaselineRow.profile == profile).values(reference_run_id=reference)
            )

        now = utcnow()
        errored = _finished(GSM8K, now - timedelta(hours=3), "manual", "c0ffee1", 4)
        errored.status, errored.verdict = "error", None
        errored.engine = {"fixed": {"url": "http://127.0.0.1:41000", "receipts": []}}  # died before /health
        errored.error = "engine exited with code 1 before it answered: CUDA out of memory (see the log tail)"
        errored.log_tail = "ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        running = Run(
            profile=GSM8K,
            status="running",
            trigger="ci",
            triggered_by="github-actions",
            triggered_role="ci",
            labels={"git_sha": "d00d1e5", "vllm_version": "0.24.1"},
            created_at=now - timedelta(minutes=3),
            started_at=now - timedelta(minutes=2),
            attempt=1,
            progress_done=10,
            progress_total=100,
            progress_phase="gsm8k",
            phase_started_at=now - timedelta(seconds=100),
            engine=_engine("fixed"),
        )
        queued = Run(
            profile=WHISPER,
            status="queued",
            trigger="manual",
            triggered_by="release-manager",
            triggered_role="admin",
            labels={"git_sha": "d00d1e5"},
            created_at=now - timedelta(minutes=1),
        )
        session.add_all([errored, running, queued])
        session.flush()
        seeded.errored, seeded.running, seeded.queued = errored.id, running.id, queued.id
        seeded.total_runs = session.scalar(select(func.count()).select_from(Run)) or 0
    return seeded


def set_progress(database_url: str, run_id: int, done: int, status: str | None = None) -> None:
    """Move a run along as a worker would, from outside the service process."""
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert run is not None
        run.progress_done = done
        if status is not None:
            run.status = status
            run.finished_at = utcnow()
            run.verdict = "pass" if status == "passed" else None
