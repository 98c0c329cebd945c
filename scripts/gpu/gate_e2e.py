"""The gate on a GPU host through kvcanary itself: `kvcanary serve`, `kvcanary submit --wait`, a table.

Each row is one run submitted to a live service exactly as CI submits it (same queue,
launcher, suites, scoring and store); the table printed at the end is read back from the
service's API, and each row is checked against what the gate must show. Run it through
`scripts/gpu/gate_e2e.sh`, which sets up vLLM and kvcanary's dependencies first.

    python scripts/gpu/gate_e2e.py --out OUT \
        [--rows gsm8k,whisper,mla,legacy,tp2,drift,invariance,aa,ab5,recall,mutants,generated,share]

The `recall` group runs the recall sweep (docs/recall.md) on both retrieval fixtures for fixed, stock and
every mutant that reaches each, and prints every arm's per-position table after the gate's table.

The `mutants` group runs `kvcanary mutants --url` for each GPU fixture (its profile with the drift
and GSM8k suites): fixed and every mutant of kernels.mutants as the arms of one run, and prints the matrix as
docs/mutants.md quotes it (also written to OUT/mutants-<fixture>.md). The `generated` group does the same
for the generated mutants each fixture reaches, one half after the other (`--halves`, default
held-out,tuning), and prints the kill rate per suite and fixture with every survivor (kill_rate.py; also
written to OUT/kill-rate-<half>.md).

The `share` group runs each GPU matrix twice, a fresh engine per arm and then on shared engines,
and prints the times side by side, the A/A across a switch and the prefix-cache probe
(`gate_share.py`; also written to OUT/share.md). The A/A rows (`aa`, `ab5`) ask for fresh engines:
their floor is the engine-to-engine difference.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import kill_rate
from gate_share import shared_vs_fresh

from evals.numbers import format_number

Check = Callable[[dict[str, Any]], list[str]]


@dataclass(frozen=True)
class Row:
    key: str
    group: str
    profile: str
    args: tuple[str, ...]
    expected: str
    check: Check = field(repr=False)


def _metrics(run: dict[str, Any], arm: str) -> list[dict[str, Any]]:
    return [m for m in run["metrics"] if m["arm"] == arm and m["verdict"] is not None]


def _arm_verdicts(run: dict[str, Any], arm: str, allowed: set[str]) -> list[str]:
    found = _metrics(run, arm)
    if not found:
        return [f"{arm} arm has no judged metric"]
    return [f"{arm} {m['suite']}.{m['metric']} is {m['verdict']}" for m in found if m["verdict"] not in allowed]


def _on_path(run: dict[str, Any], arm: str, workers: int = 1) -> list[str]:
    """Receipts of the processes that run the model: injected arms on the path, stock ones not."""
    receipts = [r for r in run["engine"].get(arm, {}).get("receipts", []) if r.get("runs_model")]
    if arm == "stock":
        wrong = [r["pid"] for r in receipts if r.get("on_execution_path")]
        return [f"stock arm: process {pid} says kernels were injected" for pid in wrong]
    good = [r for r in receipts if r.get("on_execution_path") is True]
    if len(good) < workers:
        paths = [r.get("execution_path") for r in receipts]
        return [f"{arm} arm: {len(good)} of {workers} model processes on the execution path ({paths})"]
    return []


def _every_on_path(run: dict[str, Any]) -> list[str]:
    return [p for arm in run["variants"] for p in _on_path(run, arm)]


def _status(run: dict[str, Any], status: str) -> list[str]:
    return [] if run["status"] == status else [f"run is {run['status']}, not {status}: {run['error'] or ''}"]


def _broken(run: dict[str, Any], arm: str) -> list[str]:
    """An arm that reads wrong KV either fails its metrics or kills its engine with a CUDA error."""
    if f"arm {arm!r} died" in (run["error"] or "") or (run["status"] == "error" and len(run["variants"]) < 2):
        return [] if "CUDA error" in (run["error"] or "") else [f"no CUDA error named: {run['error'][:200]}"]
    return _arm_verdicts(run, arm, {"fail"})


def _fresh_engines(count: int) -> tuple[str, ...]:
    """`count` arms of the fixed kernels on fresh engines: A/A repeats. Arms must differ, so each sets
    a prefill budget past anything a run schedules (65,536 + i tokens per step: no prompt or batch of
    these fixtures is ever chunked), which leaves the engines' math and scheduling the same; the run
    asks for a fresh engine per arm all the same (`--fresh-engines`)."""
    arms = (arg for i in range(count) for arg in ("--compare", f"fixed,max_num_batched_tokens={65536 + i}"))
    return ("--fresh-engines", *arms)


def _switched(run: dict[str, Any], arms: list[str], workers: int) -> list[str]:
    """The arms ran on one engine, and every later arm's model processes wrote receipts of its switch."""
    if run.get("engine_groups") != [arms]:
        return [f"engines {run.get('engine_groups')}, not one for {arms}"]
    problems = []
    for generation, arm in enumerate(arms[1:], 1):
        receipts = [r for r in run["engine"].get(arm, {}).get("receipts", []) if r.get("runs_model")]
        done = [r for r in receipts if (r.get("switch") or {}).get("generation") == generation]
        if len(done) < workers:
            problems.append(f"{arm}: {len(done)} of {workers} model processes switched to generation {generation}")
    return problems


def _no_fail(run: dict[str, Any], first: int = 0) -> list[str]:
    """A/A: every judged metric of the arms from ``first`` on anything but `fail` (drift judges no
    reference arm: ``first=1``), every arm's receipts on the path."""
    verdicts = [p for arm in run["variants"][first:] for p in _arm_verdicts(run, arm, {"pass", "warn", "inconclusive"})]
    return verdicts + _every_on_path(run)


def rows() -> list[Row]:
    ab = ("--compare", "stock,fixed")
    nan, high = ("--canary", "nan_kv_tail"), ("--canary", "high_block_ids")
    return [
        Row("gsm8k-ab", "gsm8k", "gsm8k-tiny-gpu", ab, "both arms pass; paired: no significant change",
            lambda r: _status(r, "passed") + _arm_verdicts(r, "stock", {"pass"})
            + _arm_verdicts(r, "fixed", {"pass", "inconclusive"}) + _on_path(r, "stock") + _on_path(r, "fixed")),
        Row("whisper-ab", "whisper", "whisper-tiny-en-gpu", (*ab, *nan), "stock fails, fixed passes, run fails",
            lambda r: _status(r, "failed") + _arm_verdicts(r, "stock", {"fail"}) + _arm_verdicts(r, "fixed", {"pass"})
            + _on_path(r, "stock") + _on_path(r, "fixed")),
        Row("gsm8k-legacy", "legacy", "gsm8k-tiny-gpu", ("--variant", "legacy"), "passes (as stock)",
            lambda r: _status(r, "passed") + _on_path(r, "legacy")),
        Row("whisper-legacy", "legacy", "whisper-tiny-en-gpu", ("--variant", "legacy", *nan), "fails (as stock)",
            lambda r: _status(r, "failed") + _arm_verdicts(r, "legacy", {"fail"}) + _on_path(r, "legacy")),
        Row("gsm8k-tp2", "tp2", "gsm8k-tiny-tp2-gpu", (), "passes; receipts from both workers on the path",
            lambda r: _status(r, "passed") + _arm_verdicts(r, "fixed", {"pass"}) + _on_path(r, "fixed", workers=2)),
        Row("tp2-share", "tp2", "gsm8k-tiny-tp2-gpu", ab,
            "stock then fixed on one engine: both workers switched (receipts of switch 1), both arms pass",
            lambda r: _status(r, "passed") + _arm_verdicts(r, "fixed", {"pass", "inconclusive"})
            + _on_path(r, "stock") + _on_path(r, "fixed", workers=2) + _switched(r, ["stock", "fixed"], workers=2)),
        Row("mla-ab", "mla", "gsm8k-tiny-mla-gpu", (*ab, *high), "stock fails (wrong pages) or dies; fixed passes",
            lambda r: _broken(r, "stock") + _arm_verdicts(r, "fixed", {"pass"}) + _on_path(r, "fixed")),
        Row("mla-legacy", "legacy", "gsm8k-tiny-mla-gpu", ("--variant", "legacy", *high), "as stock",
            lambda r: _broken(r, "legacy") + _on_path(r, "legacy")),
        Row("drift-ab", "drift", "drift-tiny-gpu", ab, "fixed within the margin of stock's A/A floor (pass or warn)",
            lambda r: _status(r, "passed") + _arm_verdicts(r, "fixed", {"pass", "warn"}) + _on_path(r, "fixed")),
        Row("drift-legacy-nan", "drift", "drift-tiny-gpu", ("--compare", "stock,legacy", *nan),
            "legacy within the floor: causal attention never reads the NaN tails (the tail bug is non-causal)",
            lambda r: _status(r, "passed") + _arm_verdicts(r, "legacy", {"pass", "warn"}) + _on_path(r, "legacy")),
        Row("drift-mla-ab", "drift", "drift-tiny-mla-gpu", ab, "fixed within the margin (decode on our kernel)",
            lambda r: _status(r, "passed") + _arm_verdicts(r, "fixed", {"pass", "warn"}) + _on_path(r, "fixed")),
        Row("drift-mla-legacy", "drift", "drift-tiny-mla-gpu", ("--compare", "fixed,legacy", *high),
            "legacy drifts from fixed (wrong pages): fails",
            lambda r: _status(r, "failed") + _arm_verdicts(r, "legacy", {"fail"}) + _on_path(r, "legacy")),
        Row("inv-fixed", "invariance", "invariance-tiny-gpu", (),
            "every condition within its floor in each arm (control, 64-token chunks, CUDA graphs)",
            lambda r: _arm_verdicts(r, r["variants"][0], {"pass", "warn", "inconclusive"})
            + [p for arm in r["variants"][1:] for p in _arm_verdicts(r, arm, {"pass", "warn"})]
            + _every_on_path(r)),
        Row("inv-ab", "invariance", "invariance-tiny-gpu", ab, "fixed within the floor of stock under every condition",
            lambda r: _arm_verdicts(r, "fixed", {"pass", "warn"}) + _on_path(r, "stock") + _on_path(r, "fixed")),
        Row("inv-mla-fixed", "invariance", "invariance-tiny-mla-gpu", (),
            "every condition within its floor (control, 64-token chunks: its batch floor moves, inconclusive)",
            lambda r: [p for arm in r["variants"][1:] for p in _arm_verdicts(r, arm, {"pass", "warn", "inconclusive"})]
            + _every_on_path(r)),
        Row("inv-mla-ab", "invariance", "invariance-tiny-mla-gpu", ("--compare", "stock,fixed,split_lse_merge"),
            "stock and fixed within their floors under every condition; split_lse_merge reported (docs/mutants.md)",
            lambda r: _arm_verdicts(r, "stock", {"pass", "warn", "inconclusive"})
            + _arm_verdicts(r, "fixed", {"pass", "warn"}) + _every_on_path(r)),
        Row("inv-mla-base2", "invariance", "invariance-tiny-mla-gpu", ("--compare", "fixed,split_lse_base2"),
            "split_lse_base2 (a base-2 log-sum-exp in the merge) fails its decode conditions; fixed within its floors",
            lambda r: _arm_verdicts(r, "fixed", {"pass", "warn", "inconclusive"})
            + _arm_verdicts(r, "split_lse_base2", {"fail"}) + _every_on_path(r)),
        Row("inv-mutants", "invariance", "invariance-tiny-gpu",
            ("--compare", "fixed,chunk_context_skip,batch_row_shift,softmax_scale_drift"),
            "the mutants this fixture reaches under every condition: chunk_context_skip fails; batch_row_shift moves "
            "its own floors but fails against the control arm's batch and family conditions; softmax_scale_drift "
            "fails the arm condition's decode at the suite's 1e-3 (a kernel-only arm)",
            lambda r: _arm_verdicts(r, "fixed", {"pass", "warn", "inconclusive"})
            + _arm_verdicts(r, "chunk_context_skip", {"fail"})
            + _arm_verdicts(r, "batch_row_shift", {"fail"})
            + _arm_verdicts(r, "softmax_scale_drift", {"fail"})
            + _every_on_path(r)),
        Row("inv-mla-mutants", "invariance", "invariance-tiny-mla-gpu",
            ("--compare", "fixed,batch_row_shift,softmax_scale_drift"),
            "batch_row_shift fails against the control arm's batch and family conditions (its own floors move) or "
            "dies (wrong pages); softmax_scale_drift fails decode vs prefill",
            lambda r: _arm_verdicts(r, "fixed", {"pass", "warn", "inconclusive"})
            + _broken(r, "batch_row_shift")
            + _arm_verdicts(r, "softmax_scale_drift", {"fail"})
            + _on_path(r, "fixed") + _on_path(r, "softmax_scale_drift")),
        Row("inv-mla-legacy", "invariance", "invariance-tiny-mla-gpu", ("--compare", "fixed,legacy", *high),
            "legacy (wrong pages past the int32 wrap) fails, the verdict naming the conditions, or dies",
            lambda r: _broken(r, "legacy") + _on_path(r, "legacy")),
        Row("inv-aa", "aa", "invariance-tiny-gpu", _fresh_engines(5),
            "five fresh fixed engines: every condition within its floor, the arm condition included (0 fail)",
            _no_fail),
        Row("inv-mla-aa", "aa", "invariance-tiny-mla-gpu", _fresh_engines(5),
            "five fresh fixed engines: every condition within its floor, the arm condition included (0 fail)",
            _no_fail),
        Row("drift-aa", "aa", "drift-tiny-gpu", _fresh_engines(2), "a fresh fixed engine against fixed: pass",
            lambda r: _status(r, "passed") + _no_fail(r, first=1)),
        Row("drift-mla-aa", "aa", "drift-tiny-mla-gpu", _fresh_engines(2), "a fresh fixed engine against fixed: pass",
            lambda r: _status(r, "passed") + _no_fail(r, first=1)),
        Row("drift-ab5", "ab5", "drift-tiny-gpu", ("--compare", "stock", *_fresh_engines(5)),
            "five fresh fixed engines against stock: each within the margin (pass or warn, 0 fail)",
            lambda r: _status(r, "passed") + _no_fail(r, first=1)),
        Row("drift-mla-ab5", "ab5", "drift-tiny-mla-gpu", ("--compare", "stock", *_fresh_engines(5)),
            "five fresh fixed engines against stock: each within the margin (pass or warn, 0 fail)",
            lambda r: _status(r, "passed") + _no_fail(r, first=1)),
    ]  # fmt: skip


# The mutants whose condition each recall fixture reaches (kernels.mutants: `served`). The Llama's
# 16k prompts pass the unified kernel's split-KV threshold, so the merge mutants reach it there too.
RECALL_LLAMA_MUTANTS = ("chunk_context_skip", "batch_row_shift", "split_lse_merge", "split_lse_base2",
                        "softmax_scale_drift")  # fmt: skip
RECALL_MLA_MUTANTS = ("batch_row_shift", "split_lse_merge", "split_lse_base2", "softmax_scale_drift")


def _recall_controls(run: dict[str, Any]) -> list[str]:
    """The recall sweep's control arms: the run ends (no harness error), fixed and stock both judged
    and neither fails (stock is paired with fixed), every arm's receipts as its kind says."""
    problems = [] if run["status"] in ("passed", "failed") else [f"run is {run['status']}: {run['error'] or ''}"]
    return problems + _arm_verdicts(run, "stock", {"pass", "inconclusive"}) + _every_on_path(run)


def recall_rows() -> list[Row]:
    """The recall sweep (docs/recall.md) for fixed (the control), stock and every mutant that reaches each
    fixture; the per-position table of every arm is printed after the gate's table."""
    high = ("--canary", "high_block_ids")
    return [
        Row("recall-ab", "recall", "recall-tiny-gpu",
            ("--compare", ",".join(("fixed", "stock", *RECALL_LLAMA_MUTANTS))),
            "stock within fixed (paired); each mutant that misreads a key fails at the positions it fires",
            _recall_controls),
        Row("recall-mla-ab", "recall", "recall-tiny-mla-gpu",
            ("--compare", ",".join(("fixed", "stock", *RECALL_MLA_MUTANTS))),
            "stock within fixed (paired); each mutant that misreads a key fails at the positions it fires",
            _recall_controls),
        Row("recall-mla-legacy", "recall", "recall-tiny-mla-gpu", ("--compare", "fixed,page_offset_i32", *high),
            "page_offset_i32 (int32 page offsets past page 7,767) misreads keys and fails, or dies with a CUDA error",
            lambda r: _broken(r, "page_offset_i32") + _on_path(r, "fixed")),
    ]  # fmt: skip


def ensure_recall_fixtures(env: dict[str, str], out: Path) -> None:
    """Train a retrieval fixture whose checkpoint is not committed (the MLA one trains in minutes on a
    GPU and not in time on CPU; evals/fixtures/retrieval_model.py), before the recall rows serve it."""
    from evals.fixtures.retrieval_model import CHECKPOINT_DIRS

    for arch, folder in CHECKPOINT_DIRS.items():
        if (folder / "model.safetensors").is_file():
            continue
        print(f"== training the {arch} retrieval fixture into {folder} (not committed)", flush=True)
        log = out / f"train-retrieval-{arch}.log"
        with log.open("w") as written:
            command = [sys.executable, "-m", "evals.fixtures.retrieval_model", "--arch", arch, "--device", "cuda",
                       "--minutes", "10", "--threads", "8"]  # fmt: skip
            if subprocess.run(command, env=env, stdout=written, stderr=subprocess.STDOUT).returncode != 0:
                raise SystemExit(f"training the {arch} retrieval fixture failed; see {log}")


def recall_tables(url: str, token: str, results: Sequence[tuple[Row, dict[str, Any], float | None, list[str]]]) -> str:
    """Each recall run's per-position table (evals.recall_positions.table), from its stored samples."""
    from evals.recall_positions import table as positions

    printed = []
    headers = {"Authorization": f"Bearer {token}"}
    for row, run, _seconds, _problems in results:
        if row.group != "recall":
            continue
        arms: dict[str, list[dict[str, Any]]] = {}
        for arm in run["variants"]:
            offset, rows = 0, arms.setdefault(arm, [])
            while True:
                page = httpx.get(f"{url}/api/v1/runs/{run['id']}/samples", headers=headers, timeout=60,
                                 params={"suite": "recall", "arm": arm, "offset": offset, "limit": 500})  # fmt: skip
                found = page.raise_for_status().json()["items"]
                rows.extend(s["data"]["recall"] for s in found if "recall" in s["data"])
                offset += len(found)
                if not found:
                    break
        printed.append(f"### recall sweep, run {run['id']} {row.key} ({row.profile})\n\n{positions(arms)}")
    return "\n\n".join(printed)


# The GPU fixtures whose mutation matrix the `mutants` group measures: (name, its profiles).
MUTANT_FIXTURES = (
    ("triton-attn-llama", ("mutants-tiny-gpu",)),
    ("triton-mla-480", ("mutants-tiny-mla-gpu",)),
)


def mutation_matrices(
    env: dict[str, str], url: str, out: Path, mutants: Sequence[str], fixtures: Sequence[str]
) -> list[tuple[str, int, float, str]]:
    """`kvcanary mutants --url` per fixture: (fixture, exit code, seconds, the printed matrix);
    ``mutants`` empty: the whole catalogue; ``fixtures`` empty: both."""
    only = [arg for name in mutants for arg in ("--mutant", name)]
    measured = []
    for fixture, profiles in MUTANT_FIXTURES:
        if fixtures and fixture not in fixtures:
            continue
        began = time.monotonic()
        print(f"== mutants {fixture}: kvcanary mutants --url {url} {' '.join(profiles)}", flush=True)
        done = subprocess.run(
            _cli("mutants", "--url", url, *profiles, *only, "--poll", "3"), env={**env, "COLUMNS": "200"},
            capture_output=True, text=True,
        )  # fmt: skip
        seconds = time.monotonic() - began
        (out / f"mutants-{fixture}.log").write_text(done.stdout + done.stderr)
        (out / f"mutants-{fixture}.md").write_text(done.stdout)
        measured.append((fixture, done.returncode, seconds, done.stdout.strip()))
    return measured


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "service", *args]


def _serve(env: dict[str, str], url: str, log: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(_cli("serve"), env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"kvcanary serve did not come up; see {log}")


def _arms(run: dict[str, Any]) -> str:
    parts = []
    for arm in run["variants"] or [next(iter(run["engine"]), "-")]:
        judged = _metrics(run, arm)
        if judged:
            values = (f"{m['metric']} {format_number(m['value'])} {m['verdict']}" for m in judged)
            parts.append(f"{arm}: " + ", ".join(values))
        elif any(m["arm"] == arm for m in run["metrics"]):
            parts.append(f"{arm}: reference")  # measured, not judged: the first arm of a suite that compares outputs
        else:
            parts.append(f"{arm}: error" if f"arm {arm!r}" in (run["error"] or "") or run["status"] == "error"
                         else f"{arm}: -")  # fmt: skip
    return "; ".join(parts)


def conditions(run: dict[str, Any]) -> list[str]:
    """One line per judged invariance arm and condition: verdict, prompts, KL against its floor, what
    decided (its floor, or a check against the control arm), time."""
    lines = []
    for m in run["metrics"]:
        details = m.get("details") or {}
        if m["suite"] != "invariance" or m["verdict"] is None:
            continue
        names = sorted({key.split(".")[0] for key in details if key.endswith(".verdict")})
        for name in names:
            kl, floor = details.get(f"{name}.mean_kl"), details.get(f"{name}.floor_mean_kl")
            lines.append(
                f"| {run['id']} | {m['arm']} | {name} | {details[f'{name}.verdict']} | "
                f"{details.get(f'{name}.prompts')} | "
                f"{format_number(kl)} [{format_number(details.get(f'{name}.ci_low'))}, "
                f"{format_number(details.get(f'{name}.ci_high'))}] | {format_number(floor)} | "
                f"{format_number(details.get(f'{name}.dlogprob_excess'))} "
                f"[{format_number(details.get(f'{name}.dlogprob_ci_low'))}, "
                f"{format_number(details.get(f'{name}.dlogprob_ci_high'))}] | "
                f"{details.get(f'{name}.first_divergence')} | {details.get(f'{name}.decided_by', '-')} | "
                f"{details.get(f'{name}.seconds', '-')} |"
            )
        if details.get("skipped"):
            lines.append(f"| {run['id']} | {m['arm']} | skipped | {details['skipped']} | | | | | | | |")
    return lines


def table(results: Sequence[tuple[Row, dict[str, Any], float | None, list[str]]]) -> str:
    """The gate's result table in Markdown: one row per run, with its check."""
    lines = [
        "| run | profile | submit | arms | run status | as expected |",
        "|---|---|---|---|---|---|",
    ]
    for row, run, seconds, problems in results:
        ok = "yes" if not problems else "NO: " + "; ".join(problems)
        lines.append(
            f"| {run['id']} {row.key} | {row.profile} | {' '.join(row.args) or '(profile as is)'} | {_arms(run)} | "
            f"{run['status']} ({run['verdict'] or '-'}){'' if seconds is None else f', {seconds:.0f} s'} | {ok} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the data dir, logs, JUnit and table")
    parser.add_argument(
        "--rows",
        default="gsm8k,whisper,mla,legacy",
        help="groups (gsm8k,whisper,mla,legacy,tp2,drift,invariance,aa,ab5,recall,mutants,generated,share) or rows",
    )
    parser.add_argument("--port", type=int, default=8077)
    parser.add_argument("--mutants", default="", help="with the mutants group: only these mutants (comma list)")
    parser.add_argument("--halves", default="held-out,tuning", help="with the generated group: these halves, in order")
    parser.add_argument(
        "--mutant-fixtures",
        default="",
        help=f"with the mutants group: only these fixtures ({','.join(f for f, _ in MUTANT_FIXTURES)}; comma list)",
    )
    args = parser.parse_args()
    asked = args.rows.split(",")
    groups = set(asked)
    # In the order asked, so that what matters most runs first under a host's time limit.
    every = [*rows(), *recall_rows()]
    selected = list({row.key: row for item in asked for row in every if item in (row.group, row.key)}.values())
    matrices: list[tuple[str, int, float, str]] = []
    killed: list[str] = []
    shared, share_problems = "", list[str]()
    args.out.mkdir(parents=True, exist_ok=True)
    data_dir = args.out / "data"
    url = f"http://127.0.0.1:{args.port}"
    env = {
        **os.environ,
        "KVCANARY_DATA_DIR": str(data_dir),
        "KVCANARY_PORT": str(args.port),
        "KVCANARY_ENGINE_PYTHON": os.environ.get("KVCANARY_ENGINE_PYTHON", sys.executable),
        "PYTHONUNBUFFERED": "1",
    }
    tokens = {}
    for role in ("ci", "admin"):  # ci submits the runs; a mutation batch is started by an admin
        made = subprocess.run(_cli("tokens", "create", "--role", role, "--name", f"gpu-gate-{role}-{int(time.time())}"),
                              env=env, capture_output=True, text=True, check=True)  # fmt: skip
        tokens[role] = made.stdout.strip().splitlines()[-1]
    token = tokens["ci"]
    if any(row.group == "recall" for row in selected):
        ensure_recall_fixtures(env, args.out)
    service = _serve(env, url, args.out / "serve.log")
    results = []
    try:
        for row in selected:
            began = time.monotonic()
            print(f"== {row.key}: kvcanary submit --profile {row.profile} {' '.join(row.args)}", flush=True)
            submitted = subprocess.run(
                _cli("submit", "--url", url, "--profile", row.profile, *row.args, "--wait", "--poll", "3",
                     "--junit", str(args.out / f"junit-{row.key}.xml")),
                env={**env, "KVCANARY_TOKEN": token, "COLUMNS": "200"}, capture_output=True, text=True,
            )  # fmt: skip
            (args.out / f"submit-{row.key}.log").write_text(submitted.stdout + submitted.stderr)
            print(submitted.stdout, flush=True)
            listed = httpx.get(f"{url}/api/v1/runs", params={"limit": 1}, timeout=30).raise_for_status().json()
            run = httpx.get(f"{url}/api/v1/runs/{listed['items'][0]['id']}", timeout=30).raise_for_status().json()
            problems = row.check(run)
            results.append((row, run, time.monotonic() - began, problems))
            (args.out / f"run-{row.key}.json").write_text(json.dumps(run, indent=1, default=str))
        if "generated" in groups:
            admin = {"Authorization": f"Bearer {tokens['admin']}"}  # a batch is started by an admin
            with httpx.Client(base_url=url, headers=admin, timeout=60) as client:
                for half in args.halves.split(","):
                    gpu_profiles = {p for _, profiles in MUTANT_FIXTURES for p in profiles}
                    gpu_fixtures = [f for f in kill_rate.FIXTURES if f.profile in gpu_profiles]
                    reports = [kill_rate.measure(client, f, half, None, 12 * 3600, 5.0) for f in gpu_fixtures]
                    killed.append("\n\n".join(reports))
                    (args.out / f"kill-rate-{half}.md").write_text(killed[-1] + "\n")
        if "mutants" in groups:
            only = [name for name in args.mutants.split(",") if name]
            fixtures = [name for name in args.mutant_fixtures.split(",") if name]
            matrices = mutation_matrices({**env, "KVCANARY_TOKEN": tokens["admin"]}, url, args.out, only, fixtures)
        if "share" in groups:
            shared, share_problems = shared_vs_fresh(url, token, data_dir / "kvcanary.db")
            (args.out / "share.md").write_text(shared + "\n")
    finally:
        service.terminate()
        service.wait(60)
    printed = table(results) if results else ""
    per_condition = [line for _row, run, _s, _p in results for line in conditions(run)]
    if per_condition:
        head = (
            "| run | arm | condition | verdict | prompts | mean KL [95% CI] | floor "
            "| decode \\|Δ logprob\\| over the floor [90% CI] | first divergence | decided by | seconds |"
        )
        printed += f"\n\n{head}\n|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(per_condition)
    recall = recall_tables(url, token, results) if any(row.group == "recall" for row, *_ in results) else ""
    if recall:
        printed += f"\n\n{recall}"
    for report in killed:
        printed += f"\n\n{report}"
    for fixture, code, seconds, matrix in matrices:
        printed += f"\n\n### mutants, {fixture} (kvcanary mutants exit {code}, {seconds / 60:.1f} min)\n\n{matrix}"
    if shared:
        printed += "\n\n### share: fresh vs shared engines\n\n" + shared
        printed += "".join(f"\n- PROBLEM: {problem}" for problem in share_problems)
    print(printed)
    (args.out / "table.md").write_text(printed + "\n")
    database = data_dir / "kvcanary.db"
    if database.exists():  # SQLite's backup, not a file copy: the last writes may still be in the WAL
        with sqlite3.connect(database) as source, sqlite3.connect(args.out / "kvcanary.db") as copy:
            source.backup(copy)
    matrices_ok = all(code == 0 for _, code, _, _ in matrices)
    rows_ok = all(not problems for *_, problems in results)
    return 0 if rows_ok and matrices_ok and not share_problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
