"""Arms: which arms a run has, whether the profile's engine can take each, and what they did.

An arm is a kernel variant plus engine overrides (`service.profiles.ArmSpec`); its name,
`variant[,key=value...]`, keys every stored row. This module decides a run's arms and
expectations (the request's, else the profile's), checks them against the profile's engine
(`service.profiles.check_arms`, the check a profile's own validation makes), builds the
profile an arm's engine is started from, and turns per-arm verdicts into the run's outcome
against its expectations.

An arm *fails* when any metric judged for it has the verdict `fail`; it *passes* otherwise
(inconclusive and no-baseline metrics included, as they pass a run). The reference arm of a
suite that compares outputs (drift) has no verdict of its own there: a difference fails the
other arm. An arm whose engine died has the verdict `error`, which meets no expectation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from service.profiles import ArmError, ArmSpec, Expectation, Profile, RunOverrides, check_arms

ArmVerdict = Literal["pass", "fail", "error"]
Outcome = Literal["as_expected", "unexpected"]


@dataclass(frozen=True)
class Plan:
    """A run's arms (empty: one arm, the profile's own variant) and expectations (None: none)."""

    arms: list[ArmSpec]
    expect: dict[str, Expectation] | None

    def stored_arms(self) -> list[dict[str, Any]]:
        return [arm.stored() for arm in self.arms]


def apply(profile: Profile, arm: ArmSpec) -> Profile:
    """The profile an arm's engine starts from: its variant, its engine overrides in place."""
    return profile.model_copy(
        update={
            "kernels": profile.kernels.model_copy(update={"variant": arm.variant}),
            "engine": arm.on(profile.engine),
        }
    )


def engine_change(profile: Profile, arm: ArmSpec, control: ArmSpec) -> dict[str, list[Any]]:
    """The engine arguments in which `arm`'s engine differs from `control`'s, `{key: [control's, arm's]}`:
    empty when the two differ in kernel variant alone (the verdicts hold such an arm to more)."""
    mine, theirs = (
        apply(profile, arm).engine.model_dump(mode="json"),
        apply(profile, control).engine.model_dump(mode="json"),
    )
    return {key: [theirs[key], value] for key, value in mine.items() if value != theirs[key]}


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
    if expect is None and compare is None:
        expect = profile.expect
    check_arms(profile, arms, variant, canaries, expect)
    return Plan(arms, dict(expect) if expect else None)


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
