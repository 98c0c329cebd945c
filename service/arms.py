"""Arms: which arms a run has, whether the profile's engine can take each, and what they did.

An arm is a kernel variant plus engine overrides (`service.profiles.ArmSpec`); its name,
`variant[,key=value...]`, keys every stored row. This module decides a run's arms and
expectations (the request's, else the profile's), refuses an arm the engine cannot take
with the reason, builds the profile an arm's engine is started from, and turns per-arm
verdicts into the run's outcome against its expectations.

An arm *fails* when any metric judged for it has the verdict `fail`; it *passes* otherwise
(inconclusive and no-baseline metrics included, as they pass a run). The reference arm of a
suite that compares outputs (drift) has no verdict of its own there: a difference fails the
other arm. An arm whose engine died has the verdict `error`, which meets no expectation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from service.profiles import ArmSpec, EngineOverrides, EngineSpec, Expectation, Profile, ProfileError, RunOverrides

ArmVerdict = Literal["pass", "fail", "error"]
Outcome = Literal["as_expected", "unexpected"]
# The engine flag each override becomes (booleans as --flag / --no-flag).
FLAGS = {
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "enable_chunked_prefill": "--enable-chunked-prefill",
    "enable_prefix_caching": "--enable-prefix-caching",
    "block_size": "--block-size",
    "enforce_eager": "--enforce-eager",
    "kv_cache_dtype": "--kv-cache-dtype",
    "max_model_len": "--max-model-len",
}
assert set(FLAGS) == set(EngineOverrides.model_fields), "every override needs its engine flag"


class ArmError(ProfileError):
    """Arms or expectations a run cannot have; the message names the arm and the reason."""


@dataclass(frozen=True)
class Plan:
    """A run's arms (empty: one arm, the profile's own variant) and expectations (None: none)."""

    arms: list[ArmSpec]
    expect: dict[str, Expectation] | None

    def stored_arms(self) -> list[dict[str, Any]]:
        return [arm.stored() for arm in self.arms]


def apply(profile: Profile, arm: ArmSpec) -> Profile:
    """The profile an arm's engine starts from: its variant, its engine overrides in place."""
    engine = profile.engine.model_copy(update=arm.engine.model_dump(exclude_none=True))
    return profile.model_copy(
        update={"kernels": profile.kernels.model_copy(update={"variant": arm.variant}), "engine": engine}
    )


def engine_change(profile: Profile, arm: ArmSpec, control: ArmSpec) -> dict[str, list[Any]]:
    """The engine arguments in which `arm`'s engine differs from `control`'s, `{key: [control's, arm's]}`:
    empty when the two differ in kernel variant alone (the verdicts hold such an arm to more)."""
    mine, theirs = (
        apply(profile, arm).engine.model_dump(mode="json"),
        apply(profile, control).engine.model_dump(mode="json"),
    )
    return {key: [theirs[key], value] for key, value in mine.items() if value != theirs[key]}


def _given_flags(engine: EngineSpec) -> set[str]:
    return {arg.split("=", 1)[0].replace("--no-", "--") for arg in engine.extra_args if arg.startswith("--")}


def refusals(profile: Profile, arm: ArmSpec, canaries: Iterable[str]) -> list[str]:
    """Why the profile's engine cannot run this arm; empty when it can."""
    reasons = []
    overrides = arm.engine.model_dump(exclude_none=True)
    in_extra = _given_flags(profile.engine)
    for key in overrides:
        if FLAGS[key] in in_extra:
            reasons.append(
                f"{key}: profile {profile.name!r} passes {FLAGS[key]} in engine.extra_args, which would win over "
                f"the arm; set engine.{key} in the profile instead"
            )
    dtype = overrides.get("kv_cache_dtype")
    if dtype not in (None, "auto") and (arm.variant != "stock" or list(canaries)):
        reasons.append(
            f"kv_cache_dtype={dtype}: kvcanary's kernels read only fp16, bf16 and fp32 KV pages, not a quantised "
            "KV cache; only an arm with variant stock and no canaries (vLLM's own kernels) can take it"
        )
    engine = apply(profile, arm).engine
    budget, length = engine.max_num_batched_tokens, engine.max_model_len
    if engine.enable_chunked_prefill is False and budget is not None and length is not None and budget < length:
        reasons.append(
            f"max_num_batched_tokens={budget} is below max_model_len={length} with chunked prefill off: vLLM refuses "
            "to start (no prompt longer than one step's budget could be served); enable chunked prefill or raise it"
        )
    return reasons


def plan(
    profile: Profile,
    overrides: RunOverrides,
    compare: list[ArmSpec] | None,
    expect: Mapping[str, Expectation] | None,
) -> Plan:
    """A run's arms and expectations: the request's compare, else the profile's; the request's
    expect, else (when the request named no arms) the profile's. ArmError says what is wrong."""
    arms = list(compare if compare is not None else profile.compare or [])
    variant = overrides.kernel_variant or profile.kernels.variant
    canaries = overrides.canaries if overrides.canaries is not None else profile.kernels.canaries
    names = [arm.name for arm in arms]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ArmError(f"compare lists arm {', '.join(twice)} more than once; each arm must differ")
    problems = [f"arm {arm.name}: {reason}" for arm in arms for reason in refusals(profile, arm, canaries)]
    if problems:
        raise ArmError("; ".join(problems))
    if expect is None and compare is None:
        expect = profile.expect
    if not expect:
        return Plan(arms, None)
    known = names or [ArmSpec(variant=variant).name]
    unknown = [name for name in expect if name not in known]
    if unknown:
        raise ArmError(f"expect names {', '.join(unknown)}, not an arm of this run; its arms: {', '.join(known)}")
    return Plan(arms, dict(expect))


def run_arms(stored: list[dict[str, Any]], profile: Profile) -> list[ArmSpec]:
    """The arms a run executes: its stored ones, else one arm of the (resolved) profile's variant."""
    arms = [ArmSpec.model_validate({"variant": a["variant"], "engine": a["engine"]}) for a in stored]
    return arms or [ArmSpec(variant=profile.kernels.variant)]


def arm_verdicts(names: Iterable[str], judged: Iterable[tuple[str, str]], dead: Iterable[str]) -> dict[str, ArmVerdict]:
    """Per arm: error if its engine died, fail if any (arm, metric verdict) of it is fail, else pass."""
    failed = {arm for arm, verdict in judged if verdict == "fail"}
    died = set(dead)
    return {name: "error" if name in died else "fail" if name in failed else "pass" for name in names}


def outcome(expect: Mapping[str, str], verdicts: Mapping[str, str]) -> Outcome:
    """as_expected when every arm `expect` names has the verdict expected of it."""
    return "as_expected" if all(verdicts.get(name) == wanted for name, wanted in expect.items()) else "unexpected"


def describe_outcome(expect: Mapping[str, str] | None, verdicts: Mapping[str, str]) -> str:
    """The outcome in a sentence: which arms did not do what was expected, or that all did."""
    if not expect:
        return ""
    missed = [
        f"{name} was expected to {wanted} and {_did(verdicts.get(name))}"
        for name, wanted in expect.items()
        if verdicts.get(name) != wanted
    ]
    if missed:
        return "unexpected: " + "; ".join(missed)
    return "as expected: " + ", ".join(f"{name} {_did(wanted)}" for name, wanted in expect.items())


def _did(verdict: str | None) -> str:
    return {"pass": "passed", "fail": "failed", "error": "errored (its engine died)"}.get(
        verdict or "", "was not judged"
    )


def parse_compare(values: Iterable[str]) -> list[str]:
    """The CLI's `--compare` values as arm names: a comma-separated word without `=` starts an
    arm (its variant), one with `=` sets an engine override of the arm before it. So
    `stock,fixed` is two arms, and `fixed` plus `fixed,max_num_batched_tokens=64` is two more."""
    arms: list[list[str]] = []
    for value in values:
        for word in (w.strip() for w in value.split(",")):
            if "=" not in word:
                arms.append([word])
            elif not arms:
                raise ArmError(f"--compare {value!r}: {word!r} sets an engine override before any variant names an arm")
            else:
                arms[-1].append(word)
    return [",".join(words) for words in arms]


def parse_expect(values: Iterable[str]) -> dict[str, Expectation]:
    """The CLI's `--expect ARM=pass|fail` values (the last `=` separates: arm names hold `=` too)."""
    expect: dict[str, Expectation] = {}
    for value in values:
        name, sep, wanted = value.rpartition("=")
        if not sep or not name or wanted not in ("pass", "fail"):
            raise ArmError(f"--expect {value!r} must be ARM=pass or ARM=fail, e.g. legacy=fail")
        expect[name] = "pass" if wanted == "pass" else "fail"
    return expect
