"""The engine launcher: argv and environment from a profile, start, health watch, clean stop."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from kernels.receipt import write_receipt
from service.engine import Engine, EngineStartError, build_argv, build_env
from service.engine.health import HealthWatch
from service.engine.launcher import read_tail
from service.engine.process_group import start_group, stop_group
from service.profiles import Profile
from tests.conftest import CanaryEngine

MakeProfile = Callable[..., Profile]

PYTHON = "/opt/py/bin/python"


def live_group_members(pgid: int) -> list[psutil.Process]:
    """What psutil sees alive in the group, asked here rather than through the launcher."""
    alive = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return alive


# --- argv and environment -------------------------------------------------------------------


def test_argv_carries_every_engine_setting_as_its_own_item(make_profile: MakeProfile) -> None:
    extra = ["--max-num-seqs", "8", "--override-generation-config", '{"temperature": 0}', "a b; rm -rf /"]
    profile = make_profile(
        "/models/m one",
        name="big",
        engine={
            "tensor_parallel_size": 4,
            "max_model_len": 4096,
            "attention_backend": "TRITON_ATTN",
            "trust_remote_code": True,
            "dtype": "bfloat16",
            "gpu_memory_utilization": 0.85,
            "enforce_eager": True,
            "extra_args": extra,
        },
    )
    argv = build_argv(profile, port=8123, python=PYTHON)
    assert argv == [
        PYTHON, "-m", "vllm.entrypoints.openai.api_server",
        "--model", "/models/m one",
        "--served-model-name", "big",
        "--host", "127.0.0.1",
        "--port", "8123",
        "--tensor-parallel-size", "4",
        "--dtype", "bfloat16",
        "--max-model-len", "4096",
        "--attention-backend", "TRITON_ATTN",
        "--gpu-memory-utilization", "0.85",
        "--trust-remote-code",
        "--enforce-eager",
        *extra,
    ]  # fmt: skip


def test_argv_leaves_out_settings_the_profile_does_not_set(make_profile: MakeProfile) -> None:
    argv = build_argv(make_profile("org/model", engine={"enforce_eager": False}), port=1, python=PYTHON)
    for flag in (
        "--max-model-len",
        "--attention-backend",
        "--gpu-memory-utilization",
        "--trust-remote-code",
        "--enforce-eager",
    ):
        assert flag not in argv
    assert argv[argv.index("--dtype") + 1] == "auto"


@pytest.mark.parametrize(
    ("variant", "canaries", "plugins", "expected"),
    [
        ("fixed", [], [], "kvcanary"),
        ("legacy", [], ["whisper_en", "other"], "kvcanary,whisper_en,other"),
        ("stock", [], [], ""),
        ("stock", [], ["whisper_en"], "whisper_en"),
        ("stock", ["nan_kv_tail"], [], "kvcanary"),
    ],
)
def test_vllm_plugins_names_ours_unless_stock_without_canaries(
    make_profile: MakeProfile, variant: str, canaries: list[str], plugins: list[str], expected: str
) -> None:
    profile = make_profile("m", engine={"plugins": plugins}, kernels={"variant": variant, "canaries": canaries})
    env = build_env(profile, receipt_dir=Path("/r"), base_env={"VLLM_PLUGINS": "from-the-host"})
    assert env["VLLM_PLUGINS"] == expected
    assert env["KVCANARY_KERNEL_VARIANT"] == variant


def test_env_layers_host_then_profile_then_plugin_settings(make_profile: MakeProfile) -> None:
    profile = make_profile(
        "m",
        engine={"env": {"OMP_NUM_THREADS": "2", "SHARED": "profile"}, "allow_unverified_vllm": True},
        kernels={"variant": "legacy", "canaries": ["nan_kv_tail", "high_block_ids"]},
    )
    env = build_env(profile, receipt_dir=Path("/runs/7/receipts"), base_env={"PATH": "/bin", "SHARED": "host"})
    assert env == {
        "PATH": "/bin",
        "SHARED": "profile",
        "OMP_NUM_THREADS": "2",
        "VLLM_PLUGINS": "kvcanary",
        "KVCANARY_KERNEL_VARIANT": "legacy",
        "KVCANARY_CANARIES": "nan_kv_tail,high_block_ids",
        "KVCANARY_RECEIPT_DIR": "/runs/7/receipts",
        "KVCANARY_ALLOW_UNVERIFIED_VLLM": "1",
        "KVCANARY_CPU_PATH": "",
        "KVCANARY_SWITCHABLE": "0",
        "VLLM_SERVER_DEV_MODE": "0",
    }
    default = build_env(make_profile("m"), receipt_dir=Path("/r"), base_env={})
    assert default["KVCANARY_CANARIES"] == ""
    assert default["KVCANARY_ALLOW_UNVERIFIED_VLLM"] == "0"


@pytest.mark.parametrize(
    ("variant", "expected"), [("fixed", "triton-interpreter"), ("legacy", "triton-interpreter"), ("stock", "")]
)
def test_cpu_path_sets_the_interpreter_for_kvcanarys_kernels_only(
    make_profile: MakeProfile, variant: str, expected: str
) -> None:
    profile = make_profile("m", kernels={"variant": variant, "cpu_path": "triton-interpreter"})
    env = build_env(profile, receipt_dir=Path("/r"), base_env={})
    assert env["KVCANARY_CPU_PATH"] == expected
    assert env.get("TRITON_INTERPRET") == ("1" if expected else None)
    assert "TRITON_INTERPRET" not in build_env(make_profile("m"), receipt_dir=Path("/r"), base_env={})


def test_cpu_path_is_refused_for_a_gpu_engine(make_profile: MakeProfile) -> None:
    with pytest.raises(ValueError, match=r"kernels\.cpu_path triton-interpreter is for CPU engines"):
        make_profile("m", engine={"needs_gpu": True}, kernels={"cpu_path": "triton-interpreter"})


def test_env_refuses_profile_env_that_would_bypass_the_kernel_settings(make_profile: MakeProfile) -> None:
    profile = make_profile("m", engine={"env": {"VLLM_PLUGINS": "", "KVCANARY_KERNEL_VARIANT": "stock"}})
    with pytest.raises(ValueError, match=r"engine\.env sets KVCANARY_KERNEL_VARIANT, VLLM_PLUGINS"):
        build_env(profile, receipt_dir=Path("/r"), base_env={})


# --- logs and receipts ----------------------------------------------------------------------


def test_log_tail_reads_the_last_lines_of_a_large_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {i} {'x' * 200}\n" for i in range(5000)) + "last line\n")
    tail = read_tail(log, 3).splitlines()
    assert [line.split()[:2] for line in tail] == [["line", "4998"], ["line", "4999"], ["last", "line"]]
    assert read_tail(tmp_path / "missing.log", 3) == ""


def test_receipts_are_read_from_the_run_folder(make_profile: MakeProfile, tmp_path: Path) -> None:
    engine = Engine(make_profile("m"), tmp_path)
    engine.receipt_dir.mkdir()
    for pid in (12, 11):
        write_receipt(engine.receipt_dir, {"pid": pid, "swapped": ["a"]})
    assert engine.receipts() == [{"pid": 11, "swapped": ["a"]}, {"pid": 12, "swapped": ["a"]}]


# --- process group and health watch without vLLM --------------------------------------------

# vLLM exits on SIGTERM, so the SIGKILL escalation needs a process tree that refuses to.
STUBBORN_TREE = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print("ready", flush=True)
time.sleep(600)
"""


def test_an_engine_writes_private_files_whatever_the_services_umask(tmp_path: Path) -> None:
    """The log and everything the engine creates in the run folder (receipts, caches) are the
    service user's alone, even where the service itself runs under a permissive umask."""
    log, made = tmp_path / "engine.log", tmp_path / "made"
    script = f"import os; open({str(made / 'receipt.json')!r}, 'w').write('{{}}'); print('wrote')"
    made.mkdir(mode=0o700)
    previous = os.umask(0o022)
    try:
        process = start_group([sys.executable, "-c", script], dict(os.environ), log)
        assert process.wait(30) == 0, log.read_text()
    finally:
        os.umask(previous)
    assert "wrote" in log.read_text()
    assert (log.stat().st_mode & 0o777, (made / "receipt.json").stat().st_mode & 0o777) == (0o600, 0o600)


def test_stop_group_escalates_to_sigkill_and_leaves_nobody(tmp_path: Path) -> None:
    log = tmp_path / "tree.log"
    process = start_group([sys.executable, "-c", STUBBORN_TREE], dict(os.environ), log)
    deadline = time.monotonic() + 30
    while len(live_group_members(process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(live_group_members(process.pid)) == 2, log.read_text()
    began = time.monotonic()
    assert stop_group(process, grace_s=1.0) == -signal.SIGKILL
    assert time.monotonic() - began >= 1.0
    assert live_group_members(process.pid) == []


class _Status(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def status_server() -> Iterator[tuple[str, type[_Status]]]:
    """An HTTP peer whose /health answers what the test sets. A real vLLM answers 503 only for
    the few seconds between its engine core's death and its own exit (code 0)."""
    handler = type("Handler", (_Status,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process
    process.kill()
    process.wait()


def test_health_watch_stops_the_run_on_503(
    status_server: tuple[str, type[_Status]], sleeper: subprocess.Popen[bytes]
) -> None:
    url, handler = status_server
    stop = threading.Event()
    watch = HealthWatch(sleeper, url, stop, interval_s=0.05)
    watch.start()
    try:
        assert not stop.wait(0.5), watch.cause
        handler.status = 503
        assert stop.wait(5)
        assert watch.cause == f"engine dead: {url}/health answered 503"
    finally:
        watch.halt()


def test_health_watch_tolerates_a_slow_probe_but_not_a_silent_server(sleeper: subprocess.Popen[bytes]) -> None:
    stop = threading.Event()
    watch = HealthWatch(sleeper, "http://127.0.0.1:1", stop, interval_s=0.05, unreachable_limit=5)
    watch.start()
    try:
        assert stop.wait(5)
        assert watch.cause is not None and "did not answer 5 times in a row" in watch.cause
    finally:
        watch.halt()


# --- a real vLLM server ---------------------------------------------------------------------


@pytest.mark.engine
def test_engine_serves_and_records_version_and_models(gsm8k_engine: Engine) -> None:
    assert gsm8k_engine.version is not None and gsm8k_engine.version[0].isdigit()
    assert [model["id"] for model in gsm8k_engine.models] == [gsm8k_engine.profile.served_model_name]
    assert gsm8k_engine.models[0]["root"] == gsm8k_engine.profile.model
    reply = httpx.post(
        f"{gsm8k_engine.url}/v1/completions",
        json={"model": gsm8k_engine.profile.served_model_name, "prompt": "Question: 1", "max_tokens": 4},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1
    assert gsm8k_engine.startup_s is not None and gsm8k_engine.startup_s > 0
    # the whole log: the shared engine may have served many requests since it started
    assert "Starting vLLM server" in gsm8k_engine.log_path.read_text(errors="replace")
    assert not gsm8k_engine.stop_event.is_set(), gsm8k_engine.stop_cause
    # The plugin settings reached vLLM: the server process itself loaded the plugin.
    receipts = gsm8k_engine.receipts()
    assert gsm8k_engine.pid in {receipt["pid"] for receipt in receipts}
    assert {receipt["variant"] for receipt in receipts} == {gsm8k_engine.profile.kernels.variant}


def _wait_for_stand_in(engine: Engine, command: str) -> EngineStartError:
    """The launcher's wait for `/health` on a shell command started as the engine would be: a real
    vLLM cannot be made to stay silent past a one-second startup timeout, or to exit at once, on cue."""
    engine.run_dir.mkdir()
    process = start_group(["/bin/sh", "-c", command], dict(os.environ), engine.log_path)
    try:
        with httpx.Client(base_url=engine.url, timeout=1.0) as client, pytest.raises(EngineStartError) as caught:
            engine._wait_healthy(process, client, time.monotonic())
    finally:
        stop_group(process, grace_s=1.0)
    return caught.value


def test_the_wait_for_health_gives_up_at_the_startup_timeout(make_profile: MakeProfile, tmp_path: Path) -> None:
    profile = make_profile("m", name="silent", engine={"startup_timeout_s": 1.0})
    began = time.monotonic()
    error = _wait_for_stand_in(Engine(profile, tmp_path / "run"), "exec sleep 60")
    assert 1.0 < time.monotonic() - began < 10 and error.exit_code is None
    said = "did not answer /health with 200 within 1 s; raise engine.startup_timeout_s in profile 'silent'"
    assert said in str(error), str(error)


def test_the_wait_for_health_names_an_exit(make_profile: MakeProfile, tmp_path: Path) -> None:
    error = _wait_for_stand_in(Engine(make_profile("m", name="exits"), tmp_path / "run"), "echo gone; exit 3")
    assert error.exit_code == 3 and "gone" in error.log_tail
    assert "exited with code 3" in str(error) and "before /health answered" in str(error), str(error)


@pytest.mark.engine
def test_bad_model_path_fails_fast_with_the_cause(
    make_profile: MakeProfile, offline_env: dict[str, str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-model"
    engine = Engine(make_profile(missing, engine={"startup_timeout_s": 600}), tmp_path / "run", base_env=offline_env)
    began = time.monotonic()
    with pytest.raises(EngineStartError) as caught:
        engine.start()
    elapsed = time.monotonic() - began
    assert elapsed < 300, f"took {elapsed:.0f} s to notice the exit"
    assert caught.value.exit_code not in (None, 0)
    assert str(missing) in caught.value.log_tail
    assert "exited with code" in str(caught.value)
    assert live_group_members(engine.pid) == []


@pytest.mark.engine
def test_killed_engine_raises_the_stop_flag_and_stop_leaves_no_process(canary_engine: CanaryEngine) -> None:
    engine = canary_engine()  # the canary test's engine, if it ran: this test ends it
    helpers = [p for p in live_group_members(engine.pid) if p.pid != engine.pid]
    assert helpers, "vLLM's engine core should run as a child in the server's process group"
    os.kill(engine.pid, signal.SIGKILL)
    assert engine.stop_event.wait(30), "the health watch did not notice the dead server"
    assert engine.stop_cause == f"engine process {engine.pid} was killed by SIGKILL (exit code -9)"
    engine.stop()
    assert engine.exit_code == -signal.SIGKILL
    assert live_group_members(engine.pid) == []
    assert all(not helper.is_running() or helper.status() == psutil.STATUS_ZOMBIE for helper in helpers)
