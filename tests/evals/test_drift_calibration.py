"""The GPU drift calibration's CPU side (scripts/gpu/drift_calibration.py): the arms it serves, the
rows it judges and the table it prints, from hand-built samples (the engines run on a GPU host)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))

from drift_calibration import Comparison, Fixture, _floor_as_candidate, arm_profile, honest_difference, plan, table

from evals.logprob_drift import PromptDrift
from evals.records import Sample
from evals.suites import drift


def _sample(key: str, kl: float, floor_kl: float = 0.0, drift_row: bool = True) -> Sample:
    def row(value: float) -> dict[str, Any]:
        return PromptDrift(None, True, 0.0, value, value, 1.0, 0.0, True, value, value, value * 9, 20, 5, 300).as_dict()

    data = {"floor": row(floor_kl), "drift": row(kl) if drift_row else None, "finite": True, "kl_tolerance": 1e-3}
    return Sample(key=key, prompt_hash="", target="", response="", data=data)


def test_each_fixture_serves_stock_fixed_and_dtype_arms_from_its_profile(tmp_path: Path) -> None:
    for name, backend in (("drift-tiny-gpu", "TRITON_ATTN"), ("drift-tiny-mla-gpu", "TRITON_MLA")):
        fixture = Fixture(name, tmp_path)
        assert isinstance(fixture.config, drift.DriftConfig) and fixture.config.limit == 32
        fp32 = arm_profile(fixture.profile, "stock", "float32")
        assert (fp32.kernels.variant, fp32.engine.dtype, fp32.engine.attention_backend) == ("stock", "float32", backend)
        assert arm_profile(fixture.profile, "fixed").engine.dtype == fixture.profile.engine.dtype
    steps = plan("drift-tiny-gpu", 5)
    assert len(steps) == 8 and "bf16 vs fp32" in steps[1] and steps[-1].endswith("repeat 5: A/A against fixed")


def test_rows_judge_the_floor_and_the_comparisons_and_the_table_quotes_them() -> None:
    floor = {f"p{i}": _floor_as_candidate(_sample(f"p{i}", 0.0, floor_kl=2e-6 * (1 + i % 3), drift_row=False))
             for i in range(16)}  # fmt: skip
    judged = drift.DRIFT.judge("drift", drift.METRIC, drift.DRIFT.scores(floor, drift.METRIC), None)
    assert judged.verdict == "warn" and judged.details["kl_excess"] > 0  # type: ignore[operator]
    dtype = {f"p{i}": _sample(f"p{i}", 5e-4 * (1 + i % 3)) for i in range(16)}
    dtype_judged = drift.DRIFT.judge("drift", drift.METRIC, drift.DRIFT.scores(dtype, drift.METRIC), None)
    rows = [
        Comparison("drift-tiny-gpu", "A/A floor in the reference arm (full concurrency vs 1)", judged),
        Comparison("drift-tiny-gpu", "bf16 vs an fp32 reference (stock kernels)", dtype_judged),
        Comparison("drift-tiny-mla-gpu", "bf16 vs an fp32 reference (stock kernels)", None, "fp32 arm did not run"),
    ]
    printed = table(rows).splitlines()
    assert len(printed) == 5 and printed[2].count("|") == printed[0].count("|")
    assert "| 16 | 3.9e-06 [" in printed[2] and printed[2].endswith("| warn |")
    assert printed[3].endswith(f"| {dtype_judged.verdict} |") and printed[4].endswith("| fp32 arm did not run |")
    honest = honest_difference(rows)  # the dtype row is not an honest kernel difference
    assert honest["kl"] == judged.details["kl_ci_high"] and honest["kl"] < 1e-5
