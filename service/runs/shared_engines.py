"""Which engine each arm of a run runs on: the one the arm before it used, switched in place,
where their engine arguments match; else a fresh one, with the reason in the run's events.

Starting vLLM is most of what an arm costs, and arms that differ only in kernel variant (or in
a canary the plugin can switch) need the same engine. Consecutive such arms share one: between
them every worker switches its kernels and canaries, the prefix cache is emptied and the switch
is checked (`service.engine.switch`). An arm starts a fresh engine when the run asks for fresh
engines (`arm_engines: fresh`, the A/A floors), when CUDA graphs are captured (they hold the
kernels of the arm that started the engine), when its engine arguments differ from the arm
before it, when the engine died in the arm before it, or when the switch failed.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernels.canaries import HIGH_BLOCK_IDS
from service.engine.launcher import RECEIPT_DIR_NAME, build_argv, build_env
from service.profiles import Profile
from service.runs.context import ArmEngine, EngineFactory

# What a switch cannot change: canaries that act while the engine starts.
INIT_TIME_CANARIES = (HIGH_BLOCK_IDS,)
# The plugin's variables that a switch changes (or that name the arm's folder).
SWITCHED_ENV = ("KVCANARY_KERNEL_VARIANT", "KVCANARY_CANARIES", "KVCANARY_RECEIPT_DIR")


def engine_arguments(profile: Profile) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """What a shared engine is started with, less what a switch changes: argv and environment."""
    init_time = [c for c in profile.kernels.canaries if c in INIT_TIME_CANARIES]
    argv = build_argv(profile, port=0, python="python", switchable=True)
    env = build_env(profile, receipt_dir=Path("."), base_env={}, switchable=True)
    kept = {key: value for key, value in env.items() if key not in SWITCHED_ENV}
    return tuple(argv), tuple(sorted({**kept, "init_time_canaries": ",".join(init_time)}.items()))


def unshareable(profile: Profile) -> str | None:
    """Why this arm's engine may serve no other arm; None when it may."""
    if profile.arm_engines == "fresh":
        return "the run asks for a fresh engine per arm (arm_engines: fresh)"
    if not profile.engine.enforce_eager:
        return (
            "enforce_eager is off: CUDA graphs captured at start-up hold the kernels of the arm that "
            "started the engine, so each arm starts its own"
        )
    return None


def _difference(profile: Profile, before: Profile) -> str:
    argv, env = engine_arguments(profile)
    argv_before, env_before = engine_arguments(before)
    changed = [arg for arg in argv if arg not in argv_before] + [f"{k}={v}" for k, v in env if (k, v) not in env_before]
    return " ".join(changed) or "the arguments' order"


def fresh_reason(arms: Sequence[tuple[str, Profile]], index: int) -> str | None:
    """Why arm `index` starts its own engine when the arm before it ran on a healthy engine; None:
    it shares that engine."""
    profile = arms[index][1]
    own = unshareable(profile)
    if index == 0 or own is not None:
        return own or "the first arm"
    before_name, before = arms[index - 1]
    if unshareable(before) is not None:
        return f"the engine of arm {before_name} serves no other arm: {unshareable(before)}"
    if engine_arguments(profile) != engine_arguments(before):
        return f"its engine arguments differ from arm {before_name}'s ({_difference(profile, before)})"
    return None


@dataclass
class ArmEngines:
    """The engines of one run's arms, in order: `take` gives each arm its engine, started or
    switched; `close` stops the current one."""

    arms: list[tuple[str, Profile]]
    factory: EngineFactory
    run_dir: Path
    stop_event: threading.Event
    event: Callable[[str, str], None]
    current: ArmEngine | None = None
    started_for: str | None = None
    engines: int = 0

    def _index(self, arm: str) -> int:
        return [name for name, _ in self.arms].index(arm)

    def profile(self, arm: str) -> Profile:
        """The profile the arm's engine serves: the run's with the arm's variant and overrides."""
        return self.arms[self._index(arm)][1]

    def take(self, arm: str) -> tuple[ArmEngine, dict[str, Any]]:
        """The arm's engine: the current one switched to the arm, or a new one not started yet
        (`use["fresh"]`); `use` says which, and why, for the arm's engine facts."""
        index = self._index(arm)
        profile = self.arms[index][1]
        reason: str | None
        if self.current is None:
            reason = "the first arm" if index == 0 else f"the engine of arm {self.arms[index - 1][0]} is gone"
        else:
            reason = fresh_reason(self.arms, index)
        if self.current is not None and reason is None:
            try:
                switched = self.current.switch(profile, self.run_dir / arm)
            except Exception as exc:
                reason = f"switching arm {self.started_for}'s engine failed: {exc}"
                shutil.rmtree(self.run_dir / arm / RECEIPT_DIR_NAME, ignore_errors=True)  # none of its own
            else:
                self.event(
                    "engine",
                    f"arm {arm}: shares engine {self.engines} (started for arm {self.started_for}), switch "
                    f"{switched.get('generation')}; prefix-cache probe: {_probe(switched)}",
                )
                return self.current, {"engine": self.engines, "started_for": self.started_for, "switch": switched}
        self.close()
        switchable = index + 1 < len(self.arms) and fresh_reason(self.arms, index + 1) is None
        self.current = self.factory(profile, self.run_dir / arm, self.stop_event, switchable=switchable)
        self.engines += 1
        self.started_for = arm
        self.event("engine", f"arm {arm}: engine {self.engines} starts ({reason})")
        return self.current, {"engine": self.engines, "started_for": arm, "fresh": reason, "switchable": switchable}

    def close(self) -> None:
        """Stop the current engine: the run ended, or its arm broke off (the next arm starts a fresh one)."""
        if self.current is not None:
            self.current.stop()
        self.current, self.started_for = None, None


def _probe(switched: dict[str, Any]) -> str:
    cache = switched.get("prefix_cache") or {}
    if not cache.get("caching"):
        return "no hit before the reset either (prefix caching off)"
    return f"{cache['hits_before_reset']:g} tokens hit before the reset, {cache['hits_after_reset']:g} after"


def same_outputs(first: Mapping[str, Mapping[str, Any]], second: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Two arms' drift outputs (a sample's `data["arm"]` by key) compared: how many prompts have the
    same tokens and logprobs bit for bit, and the largest logprob difference of the others."""
    keys = sorted(first.keys() & second.keys())
    identical, largest = 0, 0.0
    for key in keys:
        a, b = first[key], second[key]
        if a == b:
            identical += 1
            continue
        pairs = [
            (x, y)
            for field in ("logprobs", "prefill_logprobs")
            for x, y in zip(a.get(field) or [], b.get(field) or [], strict=False)
            if x is not None and y is not None
        ]
        largest = max([largest, *(abs(x - y) for x, y in pairs)])
    return {"prompts": len(keys), "identical": identical, "max_abs_logprob_diff": largest}
