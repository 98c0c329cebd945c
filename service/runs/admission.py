"""Whether a run of a profile may be queued or executed, and the profile a run keeps.

One rule, used by every trigger (the API, `kvcanary run`, `kvcanary mutants`, schedules) and
by the executor: a run's overrides must apply to its profile, its arms and expectations must
fit the profile's engine, and, where engines start on this host, the host must have the GPUs
the profile's engine needs. Each refusal is a `RunRefused` whose message names the profile
and the reason.

A run keeps the profile as it was resolved when it was triggered (`runs.profile_snapshot`:
the validated profile with the run's overrides in place), so an edit of the YAML between
trigger and execution does not change a queued run; the executor runs that snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from service.arms import Plan, plan
from service.engine.gpus import refusal
from service.engine_bounds import out_of_bounds
from service.profile_snapshot import snapshot_of
from service.profiles import ArmSpec, Expectation, Profile, ProfileError, RunOverrides, apply_overrides, describe

if TYPE_CHECKING:
    from service.db.models import Run
    from service.settings import Settings


class RunRefused(ProfileError):
    """A run that cannot be queued or executed; the message says which profile and why."""


def fitted(
    profile: Profile, overrides: RunOverrides | None = None, *, on_this_host: bool, gpus: int | None = None
) -> Profile:
    """`profile` with `overrides` in place; RunRefused when they do not apply, or (`on_this_host`)
    when this host cannot start the profile's engine (`gpus`: the GPUs it shows, None: look)."""
    try:
        applied = apply_overrides(profile, overrides or RunOverrides())
    except ValidationError as exc:
        raise RunRefused(f"overrides: profile {profile.name!r}: {describe(exc)}") from exc
    except ValueError as exc:
        raise RunRefused(f"overrides: {exc}") from exc
    reason = refusal(applied, gpus) if on_this_host else None
    if reason is not None:
        raise RunRefused(reason)
    return applied


def engines_start_here(settings: Settings) -> bool:
    """Whether this process's own worker starts the engines of the runs it queues; a service
    without one (an API front for workers elsewhere) or a Ray cluster places runs elsewhere."""
    return settings.executor == "local" and settings.start_worker


@dataclass(frozen=True)
class Admission:
    """A run that may be queued: the profile it runs (overrides in place) and its arms."""

    profile: Profile
    plan: Plan

    def snapshot(self) -> dict[str, Any]:
        """What the run stores as `profile_snapshot`."""
        return snapshot_of(self.profile)


def admit(
    profile: Profile,
    overrides: RunOverrides | None = None,
    compare: list[ArmSpec] | None = None,
    expect: Mapping[str, Expectation] | None = None,
    *,
    on_this_host: bool,
) -> Admission:
    """Check a run before it is queued (overrides, then arms and expectations, then each engine's
    arguments against the model's and vLLM's bounds, then this host); RunRefused says what is wrong."""
    overrides = overrides or RunOverrides()
    applied = fitted(profile, overrides, on_this_host=False)
    try:
        planned = plan(profile, overrides, compare, expect)
    except ProfileError as exc:
        raise RunRefused(str(exc)) from exc
    bounds = out_of_bounds(applied, planned.arms)
    if bounds:
        raise RunRefused(f"profile {profile.name!r}: " + "; ".join(bounds))
    if on_this_host:
        fitted(applied, on_this_host=True)
    return Admission(applied, planned)


def stored_profile(run: Run, profiles: Mapping[str, Profile]) -> Profile:
    """The profile a run was triggered with: its snapshot, or, for a run queued before snapshots
    were stored, its profile by name with its overrides; RunRefused when neither can be read."""
    if run.profile_snapshot is not None:
        try:
            return Profile.model_validate(run.profile_snapshot)
        except ValidationError as exc:
            raise RunRefused(
                f"run {run.id}: the profile {run.profile!r} stored when it was triggered no longer validates "
                f"({describe(exc)}); trigger a new run"
            ) from exc
    if run.profile not in profiles:
        raise RunRefused(
            f"profile {run.profile!r} is no longer in the profiles folder, and run {run.id} was queued before runs "
            "kept their profile; restore the file or trigger a new run"
        )
    try:
        overrides = RunOverrides.model_validate(run.overrides)
    except ValidationError as exc:
        raise RunRefused(
            f"run {run.id}: its stored overrides no longer validate ({describe(exc)}); trigger a new run"
        ) from exc
    return fitted(profiles[run.profile], overrides, on_this_host=False)


def executed_profile(run: Run, profiles: Mapping[str, Profile], gpus: int | None = None) -> Profile:
    """The profile a claimed run executes on this host (`stored_profile`); RunRefused when this
    host cannot start its engine."""
    return fitted(stored_profile(run, profiles), on_this_host=True, gpus=gpus)
