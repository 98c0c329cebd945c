"""Every profile the service knows: its own profile folder plus vLLM configs read as profiles."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from service.profiles import Profile, ProfileError, load_profiles, secret_env
from service.settings import Settings
from service.vllm_configs import VllmConfig, load_configs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Catalog:
    """`profiles` by name; `vllm` says which of them are vLLM configs and how they were read;
    `problems` lists vLLM files left out and keys not applied, one line each."""

    profiles: dict[str, Profile]
    vllm: dict[str, VllmConfig]
    problems: tuple[str, ...]


def load_catalog(settings: Settings) -> Catalog:
    own = load_profiles(settings.profiles_dir)
    vllm, problems = load_configs(settings.vllm_configs, settings.vllm_tensor_parallel_size)
    for name in sorted(own.keys() & vllm.keys()):
        raise ProfileError(
            f"profile {name!r} is both {settings.profiles_dir / name}.yaml and the vLLM config "
            f"{vllm[name].path}; rename one of them"
        )
    notes = [str(note) for config in vllm.values() for note in config.notes]
    return Catalog({**own, **{name: c.profile for name, c in vllm.items()}}, vllm, tuple(problems + notes))


def configured_profiles(settings: Settings) -> dict[str, Profile]:
    """The profiles by name; vLLM files left out and keys not applied go to the log."""
    catalog = load_catalog(settings)
    for problem in catalog.problems:
        log.warning("vLLM config: %s", problem)
    for name, profile in catalog.profiles.items():
        secrets = secret_env(profile)
        if secrets:
            log.warning(
                "profile %s puts %s in engine.env: each run stores the value with its profile (the API shows only "
                "the name); set it in the environment of `kvcanary serve` instead, which the engine inherits",
                name,
                ", ".join(secrets),
            )
    return catalog.profiles
