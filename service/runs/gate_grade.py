"""Gate-grade runs: which runs may decide a release.

A run decides a release only when it ran its profile as defined and a role allowed to gate
triggered it. What the trigger asked for is judged once, when the run is queued, against the
profile as it was then: an override that takes evidence away (a `limit` below a suite's own,
a subset of the suites, another kernel variant, fewer canaries, arms or expectations of the
caller's own) makes the run exploratory, and the reason is stored on the run
(`runs.exploratory`). The role is stored beside it (`runs.triggered_role`) and checked when a
release is read, against `KVCANARY_RELEASE_GATE_ROLES`, so narrowing the setting applies to
every stored run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from service.profiles import ArmSpec, Profile, RunOverrides

if TYPE_CHECKING:
    from service.db.models import Run

SCHEDULER = "scheduler"  # a schedule's fire
HOST = "host"  # the CLI on the service's own host (it holds the database)
BATCH = "a mutation batch (arms fixed and mutants)"


def exploratory_reasons(
    profile: Profile,
    overrides: RunOverrides,
    compare: list[ArmSpec] | None = None,
    expect: Mapping[str, str] | None = None,
) -> str:
    """Why a run with these overrides, arms and expectations does not run `profile` as defined; "" when it does."""
    reasons = []
    if overrides.limit is not None:
        own = {e.suite: (e.model_extra or {}).get("limit") for e in profile.suites}
        cut = [s for s, limit in own.items() if limit is None or limit > overrides.limit]
        if cut:
            kept = ", ".join(f"{s} every item" if own[s] is None else f"{s} {own[s]} items" for s in cut)
            reasons.append(f"limit {overrides.limit} (the profile runs {kept})")
    if overrides.suites is not None:
        left_out = [e.suite for e in profile.suites if e.suite not in overrides.suites]
        if left_out:
            reasons.append(f"only suites {', '.join(overrides.suites)} (leaves out {', '.join(left_out)})")
    if overrides.kernel_variant is not None and overrides.kernel_variant != profile.kernels.variant:
        reasons.append(f"kernel variant {overrides.kernel_variant} (the profile's is {profile.kernels.variant})")
    if overrides.canaries is not None:
        dropped = [c for c in profile.kernels.canaries if c not in overrides.canaries]
        if dropped:
            reasons.append(f"without the canaries {', '.join(dropped)}")
    defined = [arm.name for arm in profile.compare or []] or [profile.kernels.variant]
    if compare is not None and [arm.name for arm in compare] != defined:
        reasons.append(f"arms {', '.join(arm.name for arm in compare)} (the profile's: {', '.join(defined)})")
    if expect is not None and dict(expect) != (profile.expect or {}):
        reasons.append("expectations of its own")
    return "; ".join(reasons)


def stamp(run: Run, role: str, exploratory: str) -> None:
    """Record on a newly queued run who triggered it and why it is exploratory ("" when it is not)."""
    run.triggered_role = role
    run.exploratory = exploratory


def why_exploratory(exploratory: str, role: str, gate_roles: Collection[str]) -> str:
    """Why a run does not decide a release ("" when it does)."""
    reasons = [exploratory] if exploratory else []
    if role not in gate_roles:
        reasons.append(f"triggered by role {role or 'unknown'}, which may not gate (KVCANARY_RELEASE_GATE_ROLES)")
    return "; ".join(reasons)
