"""Prove on a GPU host that kvcanary's plugin injects its kernels and that the canaries bite.

Runs vLLM (0.24.x: the release without the fixes) through its offline `LLM` API, one engine per
run in its own process, several at once, and compares greedy outputs:

  (a) Whisper-shaped encoder-decoder on TRITON_ATTN with `nan_kv_tail`: the canary must not
      change the output under injected `fixed`, and must change it under `stock` (0.24's
      non-causal loop reads past seq_len). A decoder-only model (the GSM8k fixture) is the
      control: its causal bound stops at seq_len, so the canary changes nothing either way.
  (b) DeepSeek-V2-shaped MLA model on TRITON_MLA, a KV cache whose top page offsets pass
      2^31 elements, and `high_block_ids`: stock 0.24 crashes or corrupts, `fixed` serves the
      same tokens as without the canary.

Every run's receipts (kernels.receipt) say what was rebound and whether the backend called it.
Usage: python scripts/gpu/prove_injection.py --out DIR --whisper-tokenizer DIR [--smoke]
(`prove_injection.sh` sets up the environment; `--smoke` runs a small subset on any host).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels.receipt import read_receipts  # noqa: E402

HIGH = "high_block_ids"
PROMPTS = [
    "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:",
    "Question: A box holds 12 pens. How many pens are in 5 boxes?\nAnswer:",
    "The capital of the land of",
    "Once upon a time",
]


@dataclass(frozen=True)
class Run:
    name: str
    model: str  # whisper | llama | mla
    variant: str
    canaries: str
    kv_bytes: int


def runs(smoke: bool) -> list[Run]:
    small, mla_kv = 1 << 30, (1 << 30) if smoke else int(5.5 * (1 << 30))
    out = []
    for variant in ("stock", "fixed"):
        for canary in ("", "nan_kv_tail"):
            out.append(Run(f"whisper-{variant}-{canary or 'none'}", "whisper", variant, canary, small))
            out.append(Run(f"llama-{variant}-{canary or 'none'}", "llama", variant, canary, small))
        for canary in ("", "high_block_ids"):
            out.append(Run(f"mla-{variant}-{canary or 'none'}", "mla", variant, canary, mla_kv))
    return [r for r in out if not smoke or r.variant == "fixed"]


# --- one engine in its own process ---------------------------------------------------------


def serve(run: Run, model_dir: Path, result_path: Path) -> None:
    """Child process: start an offline engine, generate greedily, write tokens and logprobs."""
    from vllm import LLM, SamplingParams

    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "enforce_eager": True,
        "seed": 0,
        "kv_cache_memory_bytes": run.kv_bytes,
        "gpu_memory_utilization": 0.05,
        "max_num_seqs": 8,
    }
    if run.model == "whisper":
        kwargs |= {
            "attention_backend": "TRITON_ATTN",
            "mm_encoder_attn_backend": "TORCH_SDPA",
            "max_model_len": 448,
            "limit_mm_per_prompt": {"audio": 1},
        }
    elif run.model == "mla":
        kwargs |= {"attention_backend": "TRITON_MLA", "max_model_len": 1024}
    else:
        kwargs |= {"attention_backend": "TRITON_ATTN", "max_model_len": 1024}
    began = time.monotonic()
    llm = LLM(**kwargs)
    started = time.monotonic() - began
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0)
    prompts: list[Any] = PROMPTS
    if run.model == "whisper":
        import numpy as np

        t = np.arange(3 * 16_000) / 16_000
        audios = [(0.3 * np.sin(2 * np.pi * f * t) * np.exp(-t)).astype(np.float32) for f in (220, 440, 880)]
        prompts = [
            {
                "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (a, 16_000)}},
                "decoder_prompt": "<|startoftranscript|><|notimestamps|>",
            }
            for a in audios
        ]
    outputs = llm.generate(prompts, params)
    completions = []
    for output in outputs:
        c = output.outputs[0]
        logprobs = [entry[token].logprob for entry, token in zip(c.logprobs or [], c.token_ids, strict=True)]
        completions.append({"token_ids": list(c.token_ids), "text": c.text, "logprobs": logprobs})
    result_path.write_text(json.dumps({"started_s": started, "completions": completions}))


# --- the driver -----------------------------------------------------------------------------------


def launch(run: Run, model_dir: Path, work: Path, timeout_s: float) -> dict[str, Any]:
    run_dir = work / run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "VLLM_PLUGINS": "kvcanary",
        "KVCANARY_KERNEL_VARIANT": run.variant,
        "KVCANARY_CANARIES": run.canaries,
        "KVCANARY_RECEIPT_DIR": str(run_dir / "receipts"),
        "KVCANARY_ALLOW_UNVERIFIED_VLLM": "0",
        "PYTHONUNBUFFERED": "1",
    }
    result_path = run_dir / "result.json"
    began = time.monotonic()
    with (run_dir / "engine.log").open("w") as log:
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", json.dumps(asdict(run)), str(model_dir), str(result_path)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | str = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = f"timeout after {timeout_s:.0f} s"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the engine core outlives a crashed front end
        child.wait()
    record: dict[str, Any] = {
        "run": asdict(run),
        "exit": code,
        "seconds": round(time.monotonic() - began, 1),
        "receipts": read_receipts(run_dir / "receipts"),
    }
    if code == 0 and result_path.exists():
        record |= json.loads(result_path.read_text())
    else:
        record["error"] = _error_line(run_dir / "engine.log")
    return record


def _error_line(log: Path) -> str:
    """The most telling line of a failed run's log: a CUDA fault first, then any error."""
    lines = log.read_text(errors="replace").splitlines()
    for marks in (("illegal memory access", "CUDA error"), ("Error", "error:")):
        hits = [line for line in lines if any(m in line for m in marks)]
        if hits:
            return hits[0].strip()[:300]
    return (lines[-1] if lines else "no output").strip()[:300]


def model_runner_receipt(record: dict[str, Any]) -> dict[str, Any] | None:
    return next((r for r in record["receipts"] if r.get("runs_model")), None)


def same(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
    """Identical greedy tokens and bitwise-identical logprobs; None when either run failed."""
    if "completions" not in a or "completions" not in b:
        return None
    key = [(c["token_ids"], [repr(x) for x in c["logprobs"]]) for c in a["completions"]]
    return key == [(c["token_ids"], [repr(x) for x in c["logprobs"]]) for c in b["completions"]]


def finite(record: dict[str, Any]) -> bool:
    return "completions" in record and all(math.isfinite(x) for c in record["completions"] for x in c["logprobs"])


def describe(record: dict[str, Any]) -> str:
    receipt = model_runner_receipt(record)
    path = receipt["execution_path"] if receipt else "no receipt from a model-running process"
    calls = [n.rsplit(".", 1)[-1] for n, e in (receipt or {}).get("rebound", {}).items() if e.get("first_call_at")]
    return f"{path}; calls seen: {', '.join(calls) or 'none'}"


def claims(records: dict[str, dict[str, Any]], smoke: bool) -> list[tuple[str, bool | None, str]]:
    """(claim, held?, evidence): None when a run it needs is missing or failed to produce tokens."""
    r = records
    out: list[tuple[str, bool | None, str]] = []

    def pair(a: str, b: str) -> bool | None:
        return same(r[a], r[b]) if a in r and b in r else None

    out.append(
        (
            "whisper fixed: nan_kv_tail leaves output identical",
            pair("whisper-fixed-none", "whisper-fixed-nan_kv_tail"),
            describe(r.get("whisper-fixed-nan_kv_tail", {"receipts": []})),
        )
    )
    out.append(
        (
            "llama fixed: nan_kv_tail leaves output identical",
            pair("llama-fixed-none", "llama-fixed-nan_kv_tail"),
            describe(r.get("llama-fixed-nan_kv_tail", {"receipts": []})),
        )
    )
    mla_fixed = pair("mla-fixed-none", "mla-fixed-high_block_ids")
    out.append(
        (
            "mla fixed: high_block_ids serves the same tokens",
            mla_fixed,
            describe(r.get("mla-fixed-high_block_ids", {"receipts": []})),
        )
    )
    if smoke:
        return out
    stock_whisper = pair("whisper-stock-none", "whisper-stock-nan_kv_tail")
    out.append(
        (
            "whisper stock 0.24: nan_kv_tail changes output (reads past seq_len)",
            None if stock_whisper is None else not stock_whisper,
            f"finite logprobs with canary: {finite(r['whisper-stock-nan_kv_tail'])}"
            if "whisper-stock-nan_kv_tail" in r
            else "missing",
        )
    )
    out.append(
        (
            "llama stock 0.24 (control): nan_kv_tail leaves output identical",
            pair("llama-stock-none", "llama-stock-nan_kv_tail"),
            "causal bound stops at seq_len",
        )
    )
    high = r.get("mla-stock-high_block_ids")
    if high is None:
        out.append(("mla stock 0.24: high_block_ids crashes or corrupts", None, "missing"))
    elif "completions" not in high:
        out.append(("mla stock 0.24: high_block_ids crashes or corrupts", True, f"crashed: {high.get('error')}"))
    else:
        held = pair("mla-stock-none", "mla-stock-high_block_ids")
        out.append(
            (
                "mla stock 0.24: high_block_ids crashes or corrupts",
                None if held is None else not held,
                "served; tokens " + ("identical" if held else "differ"),
            )
        )
    return out


def page_offsets(record: dict[str, Any]) -> str:
    """The highest element offset of a page the high_block_ids canary hands the first request."""
    runner = model_runner_receipt(record)
    engine = next(
        (
            r
            for r in record.get("receipts", [])
            if r.get("canaries", {}).get("applied", {}).get(HIGH, {}).get("status") == "applied"
        ),
        None,
    )
    if runner is None or engine is None or not runner.get("kv_cache"):
        return "no receipt with both the KV cache and the high_block_ids canary"
    top = int(engine["canaries"]["applied"][HIGH]["first_handed_out"])
    stride = max(runner["kv_cache"]["block_strides"])
    return (
        f"first block handed out {top:,} x page stride {stride:,} = {top * stride:,} elements "
        f"({'past' if top * stride >= 2**31 else 'below'} 2^31 = {2**31:,})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--whisper-tokenizer", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kvcanary-proof"))
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--smoke", action="store_true", help="fixed variant only, small KV cache (any host)")
    parser.add_argument("--only", default="", help="comma list of run names to run (default: all)")
    args = parser.parse_args()
    import tiny_models

    from evals.fixtures.gsm8k_model import model_dir

    args.out.mkdir(parents=True, exist_ok=True)
    models = {
        "whisper": tiny_models.whisper(args.whisper_tokenizer, args.work / "models" / "whisper"),
        "mla": tiny_models.deepseek_mla(model_dir(), args.work / "models" / "mla"),
        "llama": model_dir(),
    }
    began = time.monotonic()
    todo = [r for r in runs(args.smoke) if not args.only or r.name in args.only.split(",")]
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = {run.name: pool.submit(launch, run, models[run.model], args.work, args.timeout) for run in todo}
        records = {name: future.result() for name, future in futures.items()}
    (args.out / "records.json").write_text(json.dumps(records, indent=1, default=str))
    with tarfile.open(args.out / "logs.tar.gz", "w:gz") as tar:
        for run in todo:
            tar.add(args.work / run.name, arcname=run.name)
    print(f"\n{len(todo)} engines in {time.monotonic() - began:.0f} s")
    print(f"{'run':34} {'exit':>5} {'secs':>5}  first tokens / error")
    for name, rec in records.items():
        first = rec["completions"][0]["token_ids"][:8] if "completions" in rec else rec.get("error", "")
        print(f"{name:34} {rec['exit']!s:>5} {rec['seconds']:>5}  {first}")
    if "mla-fixed-high_block_ids" in records:
        print("high_block_ids:", page_offsets(records["mla-fixed-high_block_ids"]))
    print("\nRESULT")
    for claim, held, evidence in claims(records, args.smoke):
        verdict = {True: "PROVEN", False: "REFUTED", None: "NOT RUN"}[held]
        print(f"{verdict:8} {claim}\n         {evidence}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        serve(Run(**json.loads(sys.argv[2])), Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        main()
