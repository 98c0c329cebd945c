"""Four releases of `vllm_version`, written with the dashboard seed's runs, samples and verdicts.

- `PREVIOUS` (0.24.0): both required profiles passed (the release the next one is held against);
- `BLOCKED` (0.25.0): GSM8k collapsed (`BLOCKED_FLIPS` items right in 0.24.0 turn wrong; the run
  fails) while Whisper passed with one utterance worse: blocked, naming the GSM8k profile;
- `PARTIAL` (0.25.1): GSM8k passed as an A/B run (arms stock and fixed), Whisper is still queued:
  incomplete, naming Whisper;
- `HOSTILE`: a value with markup, table pipes, quotes and URL delimiters; both passed (ready), and a
  profile that is not required passed too.
Runs are judged by `evals.verdict` from per-item rows, as scoring does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy.orm import Session

from evals.kinds.accuracy import judge_accuracy
from evals.kinds.wer import judge_wer
from evals.verdict import Baseline
from service.db.models import Baseline as BaselineRow
from service.db.models import Run, utcnow
from service.db.session import session_scope
from service.runs import store
from tests.browser.seed import (
    FILLER,
    FLEX,
    FLEX_BASELINE,
    GSM8K,
    GSM8K_BASELINE,
    STRICT,
    WHISPER,
    WORSE_UTTERANCE,
    _answer,
    _conclude,
    _finished,
    _store,
    _utterance,
)

KEY = "vllm_version"
PREVIOUS, BLOCKED, PARTIAL = "0.24.0", "0.25.0", "0.25.1"
HOSTILE = "0.26.0rc1+<b>bold</b>|*x*&amp;\"q'/?#%20"
REQUIRED = (GSM8K, WHISPER)
ITEMS = 240  # enough for 0.857 to pass the 0.7911 line: an inconclusive run is no pass
COLLAPSED_FROM = 120  # in BLOCKED, every item from here on is wrong
UTTERANCES = 12
# Wide enough that 12 utterances decide (pass): an inconclusive run is no pass for a required profile.
WER_BASELINE = Baseline(0.045, "lower", "absolute", 0.1, "whisper-large-v3, a release-gate pass line")


@dataclass
class SeededReleases:
    runs: dict[str, dict[str, int]] = field(default_factory=dict)  # release -> profile -> latest decided run
    queued_whisper: int = 0
    blocked_flips: int = 0  # GSM8k items right in PREVIOUS and wrong in BLOCKED


def _flags(release: str) -> dict[int, bool]:
    base = {i: i % 7 != 0 for i in range(ITEMS)}
    if release == BLOCKED:
        return {i: right and i < COLLAPSED_FROM for i, right in base.items()}
    return base


def _gsm8k(session: Session, release: str, arms: list[str], hours: int) -> Run:
    run = _finished(GSM8K, utcnow() - timedelta(days=30) + timedelta(hours=hours), "ci", f"a{hours:06x}", 40)
    run.labels = {KEY: release, "git_sha": f"a{hours:06x}"}
    run.arms = [{"name": arm, "variant": arm, "engine": {}} for arm in arms] if len(arms) > 1 else []
    session.add(run)
    session.flush()
    flags = _flags(release)
    previous = {f"gsm8k-{i:04d}": right for i, right in _flags(PREVIOUS).items()}
    judgements = []
    for arm in arms:
        samples = [_answer(i, right) for i, right in flags.items()]
        store.save_samples(session, run.id, arm, "gsm8k", STRICT, samples)
        keyed = {s.key: s.correct[STRICT] for s in samples}
        for metric, baseline in ((STRICT, GSM8K_BASELINE), (FLEX, FLEX_BASELINE)):
            judgement = judge_accuracy("gsm8k", metric, keyed, baseline, previous if release != PREVIOUS else None)
            _store(session, run, "gsm8k", judgement, "higher", arm)
            judgements.append(judgement)
    _conclude(run, judgements)
    return run


def _whisper(session: Session, release: str, hours: int, profile: str = WHISPER) -> Run:
    run = _finished(profile, utcnow() - timedelta(days=30) + timedelta(hours=hours), "nightly", f"b{hours:06x}", 20)
    run.labels = {KEY: release, "git_sha": f"b{hours:06x}"}
    session.add(run)
    session.flush()
    errors = [1 if i % 4 == 0 else 0 for i in range(UTTERANCES)]
    if release == BLOCKED:
        errors[int(WORSE_UTTERANCE[-4:])] = 3
    utterances = [_utterance(i, e) for i, e in enumerate(errors)]
    store.save_samples(session, run.id, "fixed", "wer", "wer", utterances)
    counts = {u.key: (u.data["wer"]["substitutions"], u.data["wer"]["ref_words"]) for u in utterances}
    judgement = judge_wer("wer", "wer", counts, WER_BASELINE)
    _store(session, run, "wer", judgement, "lower")
    _conclude(run, [judgement])
    return run


def seed_releases(database_url: str) -> SeededReleases:
    seeded = SeededReleases()
    with session_scope(database_url) as session:
        for profile, suite, metric, baseline in (
            (GSM8K, "gsm8k", STRICT, GSM8K_BASELINE),
            (GSM8K, "gsm8k", FLEX, FLEX_BASELINE),
            (WHISPER, "wer", "wer", WER_BASELINE),
        ):
            session.add(
                BaselineRow(
                    profile=profile, suite=suite, metric=metric, value=baseline.value, direction=baseline.direction,
                    tolerance_kind=baseline.tolerance_kind, tolerance=baseline.tolerance, source=baseline.source,
                )
            )  # fmt: skip
        for hours, release in enumerate((PREVIOUS, BLOCKED, PARTIAL, HOSTILE)):
            at = hours * 24
            arms = ["stock", "fixed"] if release == PARTIAL else ["fixed"]
            runs = {GSM8K: _gsm8k(session, release, arms, at).id}
            if release != PARTIAL:
                runs[WHISPER] = _whisper(session, release, at + 2).id
            if release == HOSTILE:
                runs[FILLER] = _whisper(session, release, at + 3, profile=FILLER).id
            seeded.runs[release] = runs
        queued = Run(
            profile=WHISPER, status="queued", trigger="manual", triggered_by="release-manager", triggered_role="admin",
            labels={KEY: PARTIAL}, created_at=utcnow() - timedelta(minutes=5),
        )  # fmt: skip
        session.add(queued)
        session.flush()
        seeded.queued_whisper = queued.id
    before, after = _flags(PREVIOUS), _flags(BLOCKED)
    seeded.blocked_flips = sum(1 for i in before if before[i] and not after[i])
    return seeded
