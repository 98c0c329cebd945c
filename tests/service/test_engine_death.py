"""Reading the cause of an engine's death from its log, and refusing GPU-only profiles on CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.auth import create_token
from service.db.session import session_scope
from service.engine.death import CUDA_ASYNC_NOTE, EngineDied, diagnose, diagnose_file
from service.engine.gpus import refusal, visible_gpus
from service.profiles import load_profiles
from service.roles import Role
from service.settings import PACKAGED_PROFILES, Settings
from tests.service.conftest import bearer

# Lines as vLLM 0.24 writes them when an MLA decode kernel faults: the error surfaces in a
# later cuBLAS call of the engine core, then the API server reports the dead engine.
CUDA_LOG = """\
(EngineCore_DP0 pid=4121) INFO 11-30 14:02:11 [core.py:93] Initializing a V1 LLM engine (v0.24.0)
(APIServer pid=4050) INFO:     127.0.0.1:40412 - "POST /v1/completions HTTP/1.1" 200 OK
(EngineCore_DP0 pid=4121) ERROR 11-30 14:02:15 [core.py:842] EngineCore encountered a fatal error.
(EngineCore_DP0 pid=4121) ERROR 11-30 14:02:15 [core.py:842] Traceback (most recent call last):
(EngineCore_DP0 pid=4121) ERROR 11-30 14:02:15 [core.py:842]   File "vllm/v1/engine/core.py", line 833, in run
(EngineCore_DP0 pid=4121) ERROR 11-30 14:02:15 [core.py:842] RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED \
when calling `cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb)`
(APIServer pid=4050) ERROR 11-30 14:02:15 [async_llm.py:540] vllm.v1.engine.exceptions.EngineDeadError: \
EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


def test_a_cuda_error_is_named_with_the_asynchronous_caveat() -> None:
    cause = diagnose(CUDA_LOG)
    assert cause is not None and cause.startswith("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling")
    assert CUDA_ASYNC_NOTE in cause and "\n" not in cause


def test_an_illegal_memory_access_wins_over_the_call_that_reported_it() -> None:
    log = CUDA_LOG.replace("[core.py:93]", "[core.py:93] CUDA error: an illegal memory access was encountered")
    cause = diagnose(log)
    assert cause is not None and cause.startswith("CUDA error: an illegal memory access was encountered")


def test_out_of_memory_and_python_exceptions_are_told_apart() -> None:
    oom = "ERROR [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert (diagnose(oom) or "").startswith("out of GPU memory: CUDA out of memory. Tried to allocate 2.00 GiB")
    crash = (
        "(EngineCore_DP0 pid=7) ERROR [core.py:842] Traceback (most recent call last):\n"
        "(EngineCore_DP0 pid=7) ERROR [core.py:842] ValueError: head size 96 is not supported by TRITON_MLA\n"
        "(APIServer pid=6) ERROR vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
    )
    assert diagnose(crash) == "Python exception in the engine: ValueError: head size 96 is not supported by TRITON_MLA"


def test_a_log_without_a_cause_says_none(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("INFO starting\nINFO:     Shutting down\n")
    assert diagnose_file(log) is None
    died = EngineDied(arm="stock", moment="while gsm8k ran", symptom="engine process 9 was killed by SIGKILL",
                      cause=None, log_tail="INFO starting")  # fmt: skip
    assert str(died) == (
        "the engine of arm 'stock' died while gsm8k ran: "
        "its log names no cause (engine process 9 was killed by SIGKILL)"
    )


def test_gpu_profiles_are_refused_where_no_gpu_is_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert visible_gpus(tmp_path) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert visible_gpus(tmp_path) == 1
    profiles = load_profiles(PACKAGED_PROFILES)
    assert refusal(profiles["gsm8k-tiny-cpu"], gpus=0) is None
    assert refusal(profiles["gsm8k-tiny-gpu"], gpus=1) is None
    reason = refusal(profiles["gsm8k-tiny-tp2-gpu"], gpus=1)
    assert reason is not None and "needs 2 GPUs" in reason and "shows 1" in reason


def test_kvcanary_run_refuses_a_gpu_profile_on_a_cpu_host(tmp_path: Path) -> None:
    if visible_gpus() > 0:
        pytest.skip("this host has a GPU; the refusal is for hosts without one")
    done = subprocess.run(
        [sys.executable, "-m", "service", "run", "gsm8k-tiny-mla-gpu"],
        env={"PATH": "/usr/bin:/bin", "KVCANARY_DATA_DIR": str(tmp_path), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs 1 GPU" in done.stdout and "shows 0" in done.stdout
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_api_refuses_a_gpu_profile_its_own_worker_would_run_here(tmp_path: Path) -> None:
    if visible_gpus() > 0:
        pytest.skip("this host has a GPU; the refusal is for hosts without one")
    settings = Settings(data_dir=tmp_path / "data", start_worker=True)
    with TestClient(create_app(settings)) as client:
        with session_scope(settings.resolved_database_url()) as session:
            token = create_token(session, "ci", Role.CI)
        answer = client.post("/api/v1/runs", json={"profile": "gsm8k-tiny-gpu"}, headers=bearer(token))
        assert answer.status_code == 422, answer.text
        assert "needs 1 GPU" in answer.text and "shows 0" in answer.text
        assert client.get("/api/v1/runs").json()["total"] == 0
