"""The drift suite's calibration on a GPU host: A/A floors, stock vs fixed, bf16 vs fp32, A/A repeats.

For each GPU drift fixture (`drift-tiny-gpu` on TRITON_ATTN, `drift-tiny-mla-gpu` on TRITON_MLA
with 480-token pages) it serves arms with kvcanary's own launcher, plugin and drift suite
(`service.engine.Engine`, `evals.suites.drift`), one fresh engine per arm:

1. `fp32`: stock kernels, dtype float32: a reference pass (the dtype arm's reference);
2. `stock`: stock kernels, bf16 (the profile's dtype): a reference pass whose own floor is the
   A/A at full concurrency against concurrency 1; then, as candidates against it in the same
   engine, A/A at full concurrency (the same batch composition, another order) and at 1; and
   itself against `fp32` (bf16 vs fp32);
3. `fixed`: fixed kernels, bf16: against `stock` (the honest difference the margin must admit),
   and a reference pass of its own;
4. `--repeats` fresh `fixed` engines, each an A/A against `fixed`'s reference: the outcome of each.

It prints the calibration table as docs/drift.md quotes it: per row the excess over the floor of
the prefill KL on the varying positions (mean and 90% interval), KL on answer, varying prompt
and shared-header positions, the decode |delta logprob| excess, divergent and close-rule-broken
prompts, and the outcome under the default margins; then the repeats' outcomes, and the largest
honest difference (the A/A and stock-vs-fixed rows' upper bounds), from which the default margin
is set (docs/drift.md says how). An arm whose engine cannot start (fp32 on an MLA backend, say)
is a row that says so. Run it through `scripts/gpu/gate_e2e.sh calibrate`, or with `--plan` to
print the arms without starting anything.

    python scripts/gpu/drift_calibration.py --out OUT [--fixtures drift-tiny-gpu,drift-tiny-mla-gpu] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evals.records import Sample
from evals.suites import drift
from evals.suites.base import SuiteContext
from evals.verdict import MetricJudgement
from service.engine import Engine
from service.profiles import Profile, load_profile
from service.runs.context import resolve_profile
from service.settings import PACKAGED_PROFILES

Samples = dict[str, Sample]


@dataclass(frozen=True)
class Comparison:
    """One row: a candidate pass judged against a reference pass."""

    fixture: str
    label: str
    judgement: MetricJudgement | None  # None: an arm could not run
    note: str = ""


def arm_profile(profile: Profile, variant: str, dtype: str | None = None) -> Profile:
    """The fixture profile with the arm's kernels (and dtype)."""
    data = profile.model_dump()
    data["kernels"]["variant"] = variant
    if dtype is not None:
        data["engine"]["dtype"] = dtype
    return Profile.model_validate(data)


def plan(fixture: str, repeats: int) -> list[str]:
    """What `calibrate` serves for one fixture, in order."""
    return [
        f"{fixture}: fp32 (stock, float32): reference pass",
        f"{fixture}: stock (bf16): reference pass (floor: full concurrency vs 1); A/A full vs full, full vs 1; "
        "bf16 vs fp32",
        f"{fixture}: fixed (bf16): reference pass; fixed vs stock",
        *(f"{fixture}: fixed repeat {i + 1}: A/A against fixed" for i in range(repeats)),
    ]


class Fixture:
    """The arms of one fixture, each on a fresh engine in `out`."""

    def __init__(self, name: str, out: Path) -> None:
        self.name = name
        self.profile = load_profile(PACKAGED_PROFILES / f"{name}.yaml")
        self.config: drift.DriftConfig = self.profile.suite_configs()["drift"]  # type: ignore[assignment]
        self.out = out / name

    def _pass(self, engine: Engine, tag: str, reference: Samples | None, concurrency: int | None = None) -> Samples:
        config = self.config.model_copy(
            update={"concurrency": concurrency or self.config.concurrency, "floor_concurrency": 1}
        )
        context = SuiteContext(
            server_url=engine.url,
            served_model_name=engine.profile.served_model_name,
            model_path=engine.profile.model,
            config=config,
            work_dir=self.out / tag,
            reference_samples=reference or {},
        )
        return {s.key: s for s in drift.run(context).samples}

    def serve(self, tag: str, variant: str, dtype: str | None, work: Any) -> tuple[Any, str]:
        """`work(engine)` on a fresh engine of the arm; (its result, "") or (None, why it could not run)."""
        try:
            served = resolve_profile(arm_profile(self.profile, variant, dtype))  # `fixture:` references built
            with Engine(served, self.out / tag / "engine", base_env=os.environ) as e:
                return work(e), ""
        except Exception as exc:  # an arm that cannot run is a row that says so, not the end of the table
            return None, f"{tag} arm did not run: {type(exc).__name__}: {str(exc)[:200]}"

    def calibrate(self, repeats: int) -> tuple[list[Comparison], list[Comparison]]:
        rows: list[Comparison] = []
        fp32, why_fp32 = self.serve("fp32", "stock", "float32", lambda e: self._pass(e, "fp32", None))

        def stock_work(engine: Engine) -> dict[str, Samples]:
            found = {"ref": self._pass(engine, "stock", None)}
            found["aa-full"] = self._pass(engine, "aa-full", found["ref"])
            found["aa-1"] = self._pass(engine, "aa-1", found["ref"], concurrency=1)
            if fp32:
                found["dtype"] = self._pass(engine, "dtype", fp32)
            return found

        stock, why_stock = self.serve("stock", "stock", None, stock_work)
        rows.append(self._row("A/A floor in the reference arm (full concurrency vs 1)", stock, "ref", why_stock))
        rows.append(self._row("A/A, same engine, full concurrency (another order)", stock, "aa-full", why_stock))
        rows.append(self._row("A/A, same engine, full concurrency vs 1", stock, "aa-1", why_stock))
        rows.append(self._row("bf16 vs an fp32 reference (stock kernels)", stock, "dtype", why_stock or why_fp32))

        def fixed_work(engine: Engine) -> dict[str, Samples]:
            found = {"ref": self._pass(engine, "fixed", None)}
            if stock:
                found["vs-stock"] = self._pass(engine, "vs-stock", stock["ref"])
            return found

        fixed, why_fixed = self.serve("fixed", "fixed", None, fixed_work)
        rows.append(self._row("fixed vs stock (bf16)", fixed, "vs-stock", why_fixed or why_stock))
        repeated = []
        for i in range(repeats):
            tag = f"repeat-{i + 1}"
            found, why = (None, why_fixed) if not fixed else self.serve(
                tag, "fixed", None, lambda e, tag=tag: {tag: self._pass(e, tag, fixed["ref"])}
            )  # fmt: skip
            repeated.append(self._row(f"A/A repeat {i + 1} (fresh fixed engine vs fixed)", found, tag, why))
        return rows, repeated

    def _row(self, label: str, found: Mapping[str, Samples] | None, key: str, why: str) -> Comparison:
        """The comparison, printed as its table line at once (a run cut short keeps the rows it finished)."""
        if not found or key not in found:
            made = Comparison(self.name, label, None, why or "not run")
        else:
            samples = found[key]
            if key == "ref":  # the floor itself: the reference's first pass against its second, as a candidate
                samples = {k: _floor_as_candidate(s) for k, s in samples.items()}
            judgement = drift.DRIFT.judge("drift", drift.METRIC, drift.DRIFT.scores(samples, drift.METRIC), None)
            made = Comparison(self.name, label, judgement)
        print(table([made]).splitlines()[-1], flush=True)
        return made


def _floor_as_candidate(sample: Sample) -> Sample:
    """A reference sample whose floor is judged as a drift against a zero floor."""
    zero = {**sample.data["floor"], "mean_kl": 0.0, "mean_abs_dlogprob": 0.0, "first_divergence": None, "close": True}
    return replace(sample, data={**sample.data, "drift": sample.data["floor"], "floor": zero})


def _num(details: Mapping[str, Any], key: str) -> str:
    value = details.get(key)
    return "-" if value is None else f"{value:.2g}"


def table(rows: Sequence[Comparison]) -> str:
    """The calibration table in Markdown, one line per comparison."""
    lines = [
        "| fixture | comparison | prompts | KL excess, varying positions (90% CI) | answer / prompt / shared-header KL "
        "| decode abs(delta logprob) excess (90% CI) | divergent / close rule broken | outcome (default margins) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        j = row.judgement
        if j is None:
            lines.append(f"| {row.fixture} | {row.label} | - | - | - | - | - | {row.note} |")
            continue
        d = j.details
        kl = f"{_num(d, 'kl_excess')} [{_num(d, 'kl_ci_low')}, {_num(d, 'kl_ci_high')}]"
        regions = f"{_num(d, 'answer_kl')} / {_num(d, 'prompt_kl')} / {_num(d, 'shared_kl')}"
        dlp = f"{_num(d, 'dlogprob_excess')} [{_num(d, 'dlogprob_ci_low')}, {_num(d, 'dlogprob_ci_high')}]"
        decode = f"{d.get('diverge_earlier', '-')} earlier / {d.get('close_broken', '-')}"
        if not d.get("kl_finite", True):
            kl = f"not finite ({d.get('nonfinite_prompts')} prompts)"
        lines.append(f"| {row.fixture} | {row.label} | {j.n} | {kl} | {regions} | {dlp} | {decode} | {j.verdict} |")
    return "\n".join(lines)


def honest_difference(rows: Sequence[Comparison]) -> dict[str, float]:
    """The largest upper bounds of the KL and decode excess over the A/A and fixed-vs-stock rows:
    what the margins must admit (docs/drift.md: the default margin is a few times this)."""
    honest = [r.judgement for r in rows if r.judgement is not None and not r.label.startswith("bf16")]
    return {
        "kl": max((float(j.details.get("kl_ci_high") or 0.0) for j in honest), default=0.0),
        "dlogprob": max((float(j.details.get("dlogprob_ci_high") or 0.0) for j in honest), default=0.0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fixtures", default="drift-tiny-gpu,drift-tiny-mla-gpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plan", action="store_true", help="print the arms and exit; start nothing")
    args = parser.parse_args()
    names = args.fixtures.split(",")
    if args.plan:
        print("\n".join(line for name in names for line in plan(name, args.repeats)))
        return 0
    rows: list[Comparison] = []
    repeats: list[Comparison] = []
    for name in names:
        found, repeated = Fixture(name, args.out).calibrate(args.repeats)
        rows += found
        repeats += repeated
    printed = "\n\n".join([table(rows), table(repeats), json.dumps(honest_difference(rows))])
    fails = sum(1 for r in repeats if r.judgement is not None and r.judgement.verdict == "fail")
    printed += f"\nA/A repeats: {fails} fail of {len(repeats)}"
    print(printed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.md").write_text(printed + "\n")
    explanations = {
        f"{r.fixture} | {r.label}": r.judgement.explanation if r.judgement else r.note for r in rows + repeats
    }
    (args.out / "calibration.json").write_text(json.dumps(explanations, indent=1))
    return 0 if fails == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
