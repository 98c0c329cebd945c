"""Start one vLLM OpenAI-compatible server for a run, watch it, and stop it without leftovers.

The profile decides everything the engine is started with; this module turns it into an
argv list (never a shell string) and an environment, runs the server as the leader of its
own process group with its log in the run's folder, and fails fast with the exit code and
the log tail when the server dies before it is healthy. One engine serves all suites of an
arm; started `switchable`, it serves several arms in turn (`switch`, see service.engine.switch).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import httpx
from tenacity import RetryCallState, Retrying, retry_if_result, wait_fixed

from kernels.receipt import read_receipts
from service.engine.health import HealthWatch
from service.engine.process_group import describe_exit, start_group, stop_group
from service.engine.switch import SwitchError, switch_engine
from service.private_files import append_private, private_dir
from service.profiles import Profile

HOST = "127.0.0.1"
LOG_NAME = "engine.log"
RECEIPT_DIR_NAME = "receipts"
LOG_TAIL_LINES = 80
_READY_POLL_S = 0.5
_PROBE_TIMEOUT_S = 5.0
# Variables the launcher derives from the profile's `kernels` and `engine.plugins`.
MANAGED_ENV = (
    "VLLM_PLUGINS",
    "KVCANARY_KERNEL_VARIANT",
    "KVCANARY_CANARIES",
    "KVCANARY_RECEIPT_DIR",
    "KVCANARY_ALLOW_UNVERIFIED_VLLM",
    "KVCANARY_CPU_PATH",
    "KVCANARY_SWITCHABLE",
    "VLLM_SERVER_DEV_MODE",
)
PLUGIN_NAME = "kvcanary"
WORKER_EXTENSION = "kernels.worker_extension.KernelSwitch"


class EngineStartError(RuntimeError):
    """The server exited or stayed unhealthy before it could serve; says why and shows the log."""

    def __init__(self, message: str, *, exit_code: int | None, log_tail: str) -> None:
        super().__init__(f"{message}\n--- last lines of the engine log ---\n{log_tail}")
        self.exit_code = exit_code
        self.log_tail = log_tail


def build_argv(profile: Profile, *, port: int, python: str, switchable: bool = False) -> list[str]:
    """The server's command line; every profile value is its own argv item. A switchable engine
    mixes kvcanary's worker extension into every worker (the switch between arms runs there)."""
    engine = profile.engine
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", profile.model,
        "--served-model-name", profile.served_model_name,
        "--host", HOST,
        "--port", str(port),
        "--tensor-parallel-size", str(engine.tensor_parallel_size),
        "--dtype", engine.dtype,
    ]  # fmt: skip
    if engine.max_model_len is not None:
        argv += ["--max-model-len", str(engine.max_model_len)]
    if engine.attention_backend is not None:
        argv += ["--attention-backend", engine.attention_backend]
    if engine.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(engine.gpu_memory_utilization)]
    if engine.trust_remote_code:
        argv.append("--trust-remote-code")
    if engine.enforce_eager:
        argv.append("--enforce-eager")
    if engine.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    if engine.enable_chunked_prefill is not None:
        argv.append("--enable-chunked-prefill" if engine.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if engine.enable_prefix_caching is not None:
        argv.append("--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching")
    if engine.block_size is not None:
        argv += ["--block-size", str(engine.block_size)]
    if engine.kv_cache_dtype is not None:
        argv += ["--kv-cache-dtype", engine.kv_cache_dtype]
    if switchable:
        argv += ["--worker-extension-cls", WORKER_EXTENSION]
    return argv + list(engine.extra_args)


def build_env(
    profile: Profile, *, receipt_dir: Path, base_env: Mapping[str, str], switchable: bool = False
) -> dict[str, str]:
    """`base_env` + the profile's env + what the kernel plugin reads.

    `VLLM_PLUGINS` is always set, so vLLM loads exactly the listed plugins and nothing else
    that happens to be installed; an empty value loads none (the plain stock engine). A
    switchable engine always loads the plugin (a stock arm then runs vLLM's originals through
    it) and serves vLLM's dev routes (`/collective_rpc`, `/reset_prefix_cache`) on its local port.
    """
    engine, kernels = profile.engine, profile.kernels
    clashing = sorted(set(engine.env) & set(MANAGED_ENV))
    if clashing:
        raise ValueError(
            f"profile {profile.name!r}: engine.env sets {', '.join(clashing)}, which the launcher "
            "derives from kernels.variant, kernels.canaries, engine.plugins and "
            "engine.allow_unverified_vllm; set those fields instead"
        )
    ours = [] if kernels.variant == "stock" and not kernels.canaries and not switchable else [PLUGIN_NAME]
    env = {
        **base_env,
        **engine.env,
        "VLLM_PLUGINS": ",".join(ours + engine.plugins),
        "KVCANARY_KERNEL_VARIANT": kernels.variant,
        "KVCANARY_CANARIES": ",".join(kernels.canaries),
        "KVCANARY_RECEIPT_DIR": str(receipt_dir),
        "KVCANARY_ALLOW_UNVERIFIED_VLLM": "1" if engine.allow_unverified_vllm else "0",
        "KVCANARY_CPU_PATH": "",
        "KVCANARY_SWITCHABLE": "1" if switchable else "0",
        "VLLM_SERVER_DEV_MODE": "1" if switchable else "0",
    }
    if kernels.cpu_path is not None and kernels.variant != "stock":
        # kvcanary's kernels run in Triton's interpreter only where the profile asks for it
        env |= {"KVCANARY_CPU_PATH": kernels.cpu_path, "TRITON_INTERPRET": "1"}
    return env


def free_port() -> int:
    """A port the OS calls free now; the server binds it seconds later (a clash fails the start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def read_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a possibly large log, read from the end."""
    if not path.exists():
        return ""
    with path.open("rb") as log:
        end = log.seek(0, os.SEEK_END)
        start, chunk = end, b""
        while start > 0 and chunk.count(b"\n") <= lines:
            start = max(0, start - 65536)
            log.seek(start)
            chunk = log.read(end - start)
    return b"\n".join(chunk.splitlines()[-lines:]).decode(errors="replace")


class Engine:
    """One vLLM server for one run: `with Engine(profile, run_dir) as engine: ...`.

    After `start()`: `url` serves the OpenAI API, `version` and `models` hold what `/version`
    and `/v1/models` answered, and `stop_event` is set (with `stop_cause`) if the engine dies.
    Pass the run's own event as `stop_event` so that a cancel and an engine death stop the
    suites the same way.
    """

    def __init__(
        self,
        profile: Profile,
        run_dir: Path,
        *,
        python: str = sys.executable,
        base_env: Mapping[str, str] | None = None,
        stop_event: threading.Event | None = None,
        health_interval_s: float = 2.0,
        switchable: bool = False,
    ) -> None:
        self.profile = profile
        self.run_dir = run_dir
        self.switchable = switchable
        self.log_path = run_dir / LOG_NAME
        self.receipt_dir = run_dir / RECEIPT_DIR_NAME
        self.generation = 0
        self.stop_event = stop_event if stop_event is not None else threading.Event()
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.version: str | None = None
        self.models: list[dict[str, Any]] = []
        self.startup_s: float | None = None
        self.exit_code: int | None = None
        self._python = python
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._health_interval_s = health_interval_s
        self._process: subprocess.Popen[bytes] | None = None
        self._watch: HealthWatch | None = None

    @property
    def pid(self) -> int:
        """The API server's pid, which is also its process group id."""
        if self._process is None:
            raise RuntimeError("the engine has not been started")
        return self._process.pid

    @property
    def stop_cause(self) -> str | None:
        """Why the health watch raised `stop_event`; None while the engine is fine."""
        return self._watch.cause if self._watch is not None else None

    def start(self) -> Engine:
        """Start the server and return once `/health` answers 200; raise EngineStartError if not."""
        if self._process is not None:
            raise RuntimeError(f"engine for {self.profile.name!r} was already started")
        private_dir(self.receipt_dir)
        argv = build_argv(self.profile, port=self.port, python=self._python, switchable=self.switchable)
        env = build_env(self.profile, receipt_dir=self.receipt_dir, base_env=self._base_env, switchable=self.switchable)
        shown_env = " ".join(
            f"{key}={shlex.quote(env[key])}" for key in (*MANAGED_ENV, "TRITON_INTERPRET") if key in env
        )
        with append_private(self.log_path) as log:
            log.write(f"# kvcanary starts the engine: {shown_env} {shlex.join(argv)}\n".encode())
        began = time.monotonic()
        process = self._process = start_group(argv, env, self.log_path)
        try:
            with httpx.Client(base_url=self.url, timeout=_PROBE_TIMEOUT_S) as client:
                self._wait_healthy(process, client, began)
                self.version = client.get("/version").raise_for_status().json()["version"]
                self.models = client.get("/v1/models").raise_for_status().json()["data"]
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began
        self._watch = HealthWatch(process, self.url, self.stop_event, interval_s=self._health_interval_s)
        self._watch.start()
        return self

    def _wait_healthy(self, process: subprocess.Popen[bytes], client: httpx.Client, began: float) -> None:
        """Probe `/health` every _READY_POLL_S until it answers 200 (tenacity runs the loop); an
        exit or `engine.startup_timeout_s` since `began` ends the wait with EngineStartError."""
        timeout_s = self.profile.engine.startup_timeout_s

        def healthy() -> bool:
            returncode = process.poll()
            if returncode is not None:
                raise EngineStartError(
                    f"vLLM server for model {self.profile.model!r} {describe_exit(returncode)} "
                    f"{time.monotonic() - began:.0f} s after start, before /health answered; "
                    f"the cause is in {self.log_path}",
                    exit_code=returncode,
                    log_tail=self.log_tail(),
                )
            try:
                return client.get("/health").status_code == 200
            except httpx.HTTPError:
                return False  # not listening yet

        def timed_out(_: RetryCallState) -> NoReturn:
            raise EngineStartError(
                f"vLLM server for model {self.profile.model!r} did not answer /health with 200 "
                f"within {timeout_s:.0f} s; raise engine.startup_timeout_s in profile "
                f"{self.profile.name!r} if the model is large, or read {self.log_path}",
                exit_code=None,
                log_tail=self.log_tail(),
            )

        Retrying(
            retry=retry_if_result(lambda ok: not ok),
            stop=lambda _: time.monotonic() - began > timeout_s,
            wait=wait_fixed(_READY_POLL_S),
            retry_error_callback=timed_out,
        )(healthy)

    def stop(self) -> None:
        """SIGTERM the server's group, SIGKILL after `engine.stop_grace_s`; idempotent."""
        if self._watch is not None:
            self._watch.halt()
        if self._process is None or self.exit_code is not None:
            return
        self.exit_code = stop_group(self._process, self.profile.engine.stop_grace_s)

    def death_symptom(self) -> str | None:
        """How the engine shows it is dead right now (exit, 503, no answer); None if it is alive."""
        if self.stop_cause is not None:
            return self.stop_cause
        if self._process is None:
            return None
        returncode = self._process.poll()
        if returncode is not None:
            return f"engine process {self._process.pid} {describe_exit(returncode)}"
        try:
            status = httpx.get(f"{self.url}/health", timeout=_PROBE_TIMEOUT_S).status_code
        except httpx.HTTPError as exc:
            return f"{self.url}/health did not answer: {exc!r}"
        return None if status == 200 else f"{self.url}/health answered HTTP {status}"

    def switch(self, profile: Profile, run_dir: Path) -> dict[str, Any]:
        """Serve the next arm (`profile`: its variant and canaries) with its receipts in `run_dir`;
        what the switch did, or SwitchError when it could not be done or proven."""
        if not self.switchable or self._process is None:
            raise SwitchError(f"the engine for {self.profile.name!r} was not started switchable; start a fresh one")
        receipt_dir = run_dir / RECEIPT_DIR_NAME
        private_dir(receipt_dir)
        self.generation += 1
        done = switch_engine(self.url, profile, receipt_dir, run_dir.name, self.generation, self.receipt_dir)
        self.profile, self.receipt_dir = profile, receipt_dir
        return done

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_tail(self.log_path, lines)

    def receipts(self) -> list[dict[str, Any]]:
        """The kernel plugin's injection receipts, one per vLLM process that loaded it."""
        return read_receipts(self.receipt_dir)

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
