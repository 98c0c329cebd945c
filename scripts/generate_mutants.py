"""Write kernels/generated_mutants.json: every generated mutant against fixed in Triton's interpreter.

    python scripts/generate_mutants.py [--workers 2] [--seed 20261207]

Each mutant of ``kernels.mutation_ops.sites()`` runs the probe shapes of
``kernels.mutant_probes`` whose entry point its file is on (a mutant of the unified kernel
leaves MLA decode as fixed's, by construction: not run), and its max |diff| against fixed is
recorded per shape. A mutant that raises, dies (a read far out of bounds can kill the
interpreter's process) or runs past ``--timeout`` (a loop that no longer ends) differs too,
recorded as ``error: ...``. Mutants equal to fixed on every shape are kept in the manifest as
``equivalent``, with that evidence, and those that ran past the timeout as ``hangs``; the
others are ``kept`` and split once at random with the seed into the tuning and the held-out
half. Run on a CPU host (the interpreter); 25 minutes on two busy cores.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere: everything interpreted
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.generated_mutants import HALVES, MANIFEST
from kernels.mutation_ops import FILES, OPERATOR_NAMES, Site, sites

# The entry points a file of the kernels is on.
ON_PATH = {
    "splitkv": ("unified_attention", "decode_attention_fwd"),
    "unified": ("unified_attention",),
    "decode": ("decode_attention_fwd",),
}
assert set(ON_PATH) == set(FILES)
DEFAULT_SEED = 20261207
TIMED_OUT = "ran past"


def worker() -> None:
    """Read sites (JSON lines) on stdin, answer {shape: max |diff|} per site on stdout."""
    from kernels import mutant_probes
    from kernels.decode_attention import decode_attention_fwd
    from kernels.generated_mutants import ENTRY_POINTS, build_family
    from kernels.unified_attention import unified_attention

    fixed_entries: dict[str, mutant_probes.Entry] = {
        "unified_attention": unified_attention,
        "decode_attention_fwd": decode_attention_fwd,
    }
    fixed = {shape.name: mutant_probes.run(shape, fixed_entries[shape.kernel]) for shape in mutant_probes.SHAPES}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        site = Site(**json.loads(line))
        family = build_family(site)
        evidence: dict[str, float | str] = {}
        for shape in mutant_probes.SHAPES:
            if shape.kernel not in ON_PATH[site.file]:
                continue
            entry = getattr(family[ENTRY_POINTS[shape.kernel]], shape.kernel)
            try:
                evidence[shape.name] = mutant_probes.difference(fixed[shape.name], mutant_probes.run(shape, entry))
            except Exception as exc:  # the mutant's own failure is its evidence
                evidence[shape.name] = f"error: {type(exc).__name__}: {str(exc)[:160]}"
        print(json.dumps({"id": site.id, "evidence": evidence}), flush=True)


class Worker:
    """A worker process and a thread that queues its answers, so a wait can time out."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.answers.put(json.loads(line))
        self.answers.put(None)

    def ask(self, site: Site, timeout: float) -> dict[str, float | str]:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(asdict(site)) + "\n")
            self.process.stdin.flush()
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            return {"all": f"error: {TIMED_OUT} {timeout:g} s (a loop that no longer ends)"}
        except BrokenPipeError:
            answer = None
        if answer is None:
            code = self.process.wait()
            return {"all": f"error: the process died (exit {code}): a read or write far out of bounds"}
        evidence: dict[str, float | str] = answer["evidence"]
        return evidence

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def measure(todo: list[Site], workers: int, timeout: float) -> dict[str, dict[str, float | str]]:
    pending: queue.Queue[Site] = queue.Queue()
    for site in todo:
        pending.put(site)
    results: dict[str, dict[str, float | str]] = {}
    lock = threading.Lock()

    def drive() -> None:
        current = _started()
        while True:
            try:
                site = pending.get_nowait()
            except queue.Empty:
                current.stop()
                return
            began = time.monotonic()
            evidence = current.ask(site, timeout)
            if current.process.poll() is not None:
                current = _started()
            with lock:
                results[site.id] = evidence
                print(f"{len(results)}/{len(todo)} {site.id} {time.monotonic() - began:.0f} s {evidence}", flush=True)

    threads = [threading.Thread(target=drive) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _started() -> Worker:
    started = Worker()
    ready = started.answers.get(timeout=600)
    if not ready:
        raise SystemExit("the worker could not run fixed on the probe shapes")
    return started


def status(evidence: dict[str, float | str]) -> str:
    """kept (differs from fixed), equivalent (equal on every shape), or hangs (a loop that no longer
    ends: a kernel that never returns needs no accuracy gate, and a served run would only time out)."""
    if any(isinstance(value, str) and TIMED_OUT in value for value in evidence.values()):
        return "hangs"
    return "kept" if any(value != 0.0 for value in evidence.values()) else "equivalent"


def manifest(all_sites: list[Site], evidence: dict[str, dict[str, float | str]], seed: int) -> dict[str, Any]:
    from kernels.mutant_probes import SHAPES

    statuses = {site.id: status(evidence[site.id]) for site in all_sites}
    kept = [site.id for site in all_sites if statuses[site.id] == "kept"]
    shuffled = random.Random(seed).sample(kept, len(kept))
    tuning = set(shuffled[: len(kept) // 2])
    entries = []
    for site in all_sites:
        is_kept = statuses[site.id] == "kept"
        entries.append(
            {
                **asdict(site),
                "changes": OPERATOR_NAMES[site.operator].changes,
                "status": statuses[site.id],
                "half": (HALVES[0] if site.id in tuning else HALVES[1]) if is_kept else None,
                "kernels": list(ON_PATH[site.file]),
                "evidence": evidence[site.id],
            }
        )
    return {
        "about": "Generated kernel mutants (kernels.mutation_ops) against fixed in Triton's interpreter; "
        "written by scripts/generate_mutants.py",
        "seed": seed,
        "split": "the kept ids in this order, random.Random(seed).sample(kept, len(kept)): the first half "
        "(rounded down) is the tuning half, the rest the held-out half",
        "shapes": {shape.name: shape.what for shape in SHAPES},
        "mutants": entries,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a mutant may take on all its shapes")
    parser.add_argument("--out", type=Path, default=MANIFEST)
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    all_sites = sites()
    measured = measure(all_sites, args.workers, args.timeout)
    written = manifest(all_sites, measured, args.seed)
    args.out.write_text(json.dumps(written, indent=1) + "\n")
    counts = Counter(m["status"] for m in written["mutants"])
    shown = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    print(f"{len(all_sites)} generated: {shown}; {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
