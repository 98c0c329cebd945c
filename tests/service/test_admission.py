"""One rule for whether a run may be queued or executed, and the profile a run keeps: refusals
with their reasons, the snapshot stored at trigger time surviving an edit of the profile's
YAML, the pipeline executing that snapshot, and migration 0009 on a database with rows.
Real SQLite (and PostgreSQL where a server is up), the real API in-process; no engine starts."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import MetaData, Table, create_engine

from service.app import create_app
from service.auth import create_token
from service.db.migrate import upgrade
from service.db.models import Run
from service.db.session import session_scope
from service.engine.gpus import visible_gpus
from service.profile_catalog import configured_profiles
from service.profile_snapshot import HIDDEN, digest, for_readers
from service.profiles import ArmSpec, Profile, RunOverrides, load_profiles
from service.roles import Role
from service.runs import pipeline, queue
from service.runs.admission import RunRefused, admit, executed_profile, fitted
from service.schemas import RunDetail
from service.settings import PACKAGED_PROFILES, Settings
from tests.service.conftest import bearer

CPU, GPU = "gsm8k-tiny-cpu", "gsm8k-tiny-gpu"


@pytest.fixture(scope="module")
def packaged() -> dict[str, Profile]:
    return load_profiles(PACKAGED_PROFILES)


# the rule


def test_overrides_that_do_not_apply_are_refused_naming_the_profile(packaged: dict[str, Profile]) -> None:
    with pytest.raises(RunRefused, match=rf"overrides\.suites: \['whisper'\] not in profile {CPU}"):
        fitted(packaged[CPU], RunOverrides(suites=["whisper"]), on_this_host=False)


def test_a_gpu_profile_is_refused_only_where_engines_start_on_a_host_without_its_gpus(
    packaged: dict[str, Profile],
) -> None:
    assert fitted(packaged[GPU], on_this_host=False).name == GPU
    assert fitted(packaged[GPU], on_this_host=True, gpus=1).name == GPU
    with pytest.raises(RunRefused, match=rf"profile '{GPU}' needs 1 GPU .* this host shows 0"):
        fitted(packaged[GPU], on_this_host=True, gpus=0)
    assert fitted(packaged[CPU], RunOverrides(limit=3), on_this_host=True, gpus=0).suites[0].model_extra == {
        **(packaged[CPU].suites[0].model_extra or {}),
        "limit": 3,
    }


def test_admit_refuses_arms_the_engine_cannot_take_and_keeps_the_overrides(packaged: dict[str, Profile]) -> None:
    with pytest.raises(RunRefused, match="arm fixed,kv_cache_dtype=fp8: kv_cache_dtype=fp8"):
        admit(packaged[CPU], None, [ArmSpec.model_validate("fixed,kv_cache_dtype=fp8")], None, on_this_host=False)
    admitted = admit(packaged[CPU], RunOverrides(kernel_variant="legacy", limit=5), None, None, on_this_host=False)
    stored = Profile.model_validate(admitted.snapshot())
    assert stored == admitted.profile and stored.kernels.variant == "legacy"
    assert digest(admitted.snapshot()) == digest(Profile.model_validate(admitted.snapshot()).model_dump(mode="json"))
    assert digest(admitted.snapshot()) != digest(admit(packaged[CPU], on_this_host=False).snapshot())


# the snapshot


def _copy_profile(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(PACKAGED_PROFILES / f"{name}.yaml", folder / f"{name}.yaml"))


def _edit(path: Path, change: dict[str, object]) -> None:
    data = yaml.safe_load(path.read_text())
    data.update(change)
    path.write_text(yaml.safe_dump(data))


def test_a_queued_run_executes_the_profile_it_was_triggered_with_after_its_yaml_is_edited(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", profiles_dir=tmp_path / "profiles", start_worker=False)
    path = _copy_profile(settings.profiles_dir, CPU)
    with TestClient(create_app(settings)) as client:
        with session_scope(settings.resolved_database_url()) as session:
            token = create_token(session, "ci", Role.CI)
        answer = client.post("/api/v1/runs", json={"profile": CPU, "overrides": {"limit": 3}}, headers=bearer(token))
        assert answer.status_code == 201, answer.text
        detail = RunDetail.model_validate(answer.json())
        with session_scope(settings.resolved_database_url(), write=False) as session:
            stored = session.get(Run, detail.id)
            assert stored is not None and stored.profile_snapshot is not None
            assert detail.profile_digest == digest(stored.profile_snapshot)
        assert detail.profile_snapshot == for_readers(stored.profile_snapshot)
        assert detail.profile_snapshot["suites"][0]["limit"] == 3
        _edit(path, {"kernels": {"variant": "legacy"}, "max_attempts": 1})
        again = client.get(f"/api/v1/runs/{detail.id}", headers=bearer(token)).json()
        assert again["profile_snapshot"] == detail.profile_snapshot and again["profile_digest"] == detail.profile_digest
        page = client.get(f"/runs/{detail.id}")
        assert page.status_code == 200 and detail.profile_digest in page.text and '"limit": 3' in page.text
    edited = configured_profiles(settings)  # what a worker started after the edit reads
    assert edited[CPU].kernels.variant == "legacy"
    with session_scope(settings.resolved_database_url()) as session:
        row = session.get(Run, detail.id)
        assert row is not None
        executed = executed_profile(row, edited, gpus=0)
    assert executed.kernels.variant == "fixed" and executed.max_attempts == 2
    assert executed.suites[0].model_extra is not None and executed.suites[0].model_extra["limit"] == 3
    assert digest(executed.model_dump(mode="json")) == detail.profile_digest


def test_the_pipeline_refuses_a_snapshot_this_host_cannot_run_though_the_file_now_could(
    tmp_path: Path, packaged: dict[str, Profile]
) -> None:
    """Queued while the profile needed a GPU, edited to a CPU profile since: the run still needs
    its GPU, so on a host without one the pipeline ends it `error` before any engine starts."""
    if visible_gpus() > 0:
        pytest.skip("this host has a GPU; the refusal is for hosts without one")
    settings = Settings(data_dir=tmp_path / "data", profiles_dir=tmp_path / "profiles", start_worker=False)
    url = settings.resolved_database_url()
    upgrade(url)
    admitted = admit(packaged[GPU], on_this_host=False)
    with session_scope(url) as session:
        run, _ = queue.enqueue(
            session, profile=GPU, trigger="ci", triggered_by="test", labels={}, overrides={}, arms=[],
            max_attempts=1, profile_snapshot=admitted.snapshot(),
        )  # fmt: skip
        session.flush()
        run_id = run.id
        queue.claim_next(session, "test-worker", run_id)
    now_cpu = packaged[GPU].model_copy(update={"engine": packaged[GPU].engine.model_copy(update={"needs_gpu": False})})
    assert pipeline.run_claimed(run_id, settings, {GPU: now_cpu}, "test-worker") == "error"
    with session_scope(url) as session:
        row = session.get(Run, run_id)
        assert row is not None
        assert row.error.startswith("RunRefused: ") and "needs 1 GPU" in row.error and not row.engine


# migration 0009


def test_runs_queued_before_0009_keep_no_snapshot_and_execute_their_profile_by_name(
    empty_database: str, packaged: dict[str, Profile]
) -> None:
    url = empty_database
    upgrade(url, "0008_audit_events")
    engine = create_engine(url)
    runs = Table("runs", MetaData(), autoload_with=engine)
    assert "profile_snapshot" not in runs.c
    row = {
        "profile": CPU, "status": "queued", "trigger": "ci", "triggered_by": "ci", "labels": {},
        "overrides": {"limit": 4}, "attempt": 0, "max_attempts": 1, "cancel_requested": False,
        "created_at": datetime.now(UTC), "progress_done": 0, "progress_total": 0, "progress_phase": "",
        "verdict_summary": "", "error": "", "engine": {}, "timings": {}, "log_tail": "", "run_dir": "",
    }  # fmt: skip
    with engine.begin() as connection:
        connection.execute(runs.insert(), [row])
    engine.dispose()
    upgrade(url)
    with session_scope(url) as session:
        [old] = session.query(Run).all()
        assert old.profile_snapshot is None and old.overrides == {"limit": 4}
        detail = RunDetail.of_run(old, [])
        assert detail.profile_snapshot is None and detail.profile_digest is None
        executed = executed_profile(old, packaged, gpus=0)
        assert executed.suites[0].model_extra is not None and executed.suites[0].model_extra["limit"] == 4
        with pytest.raises(RunRefused, match=f"profile {CPU!r} is no longer in the profiles folder"):
            executed_profile(old, {}, gpus=0)
        new, _ = queue.enqueue(
            session, profile=CPU, trigger="ci", triggered_by="t", labels={}, overrides={}, arms=[], max_attempts=1,
            profile_snapshot=admit(packaged[CPU], on_this_host=False).snapshot(),
        )  # fmt: skip
        session.flush()
        assert Profile.model_validate(new.profile_snapshot) == packaged[CPU]


def test_every_shipped_profile_reads_back_from_its_snapshot() -> None:
    """The snapshot is what a queued run executes: every profile the service ships (YAML and
    vLLM config files alike) must come back from its stored JSON as the same profile."""
    from service.profile_snapshot import snapshot_of
    from service.settings import PACKAGED_PROFILES

    profiles = load_profiles(PACKAGED_PROFILES)
    assert len(profiles) > 10
    for name, profile in profiles.items():
        assert Profile.model_validate(snapshot_of(profile)) == profile, name


def test_engine_env_values_are_hidden_from_readers_and_credentials_there_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A hub token in a profile's engine.env was shown to anyone reading a run; now only its name."""
    settings = Settings(data_dir=tmp_path / "data", profiles_dir=tmp_path / "profiles", start_worker=False)
    path = _copy_profile(settings.profiles_dir, CPU)
    data = yaml.safe_load(path.read_text())
    data["engine"]["env"]["HF_TOKEN"] = "hf_do-not-show-me"
    path.write_text(yaml.safe_dump(data))
    with caplog.at_level("WARNING"), TestClient(create_app(settings)) as client:
        with session_scope(settings.resolved_database_url()) as session:
            token = create_token(session, "ci", Role.CI)
        made = client.post("/api/v1/runs", json={"profile": CPU}, headers=bearer(token))
        assert made.status_code == 201, made.text
        env = made.json()["profile_snapshot"]["engine"]["env"]
        assert env["HF_TOKEN"] == HIDDEN and set(env) == set(data["engine"]["env"])
        for reader in (client.get(f"/api/v1/runs/{made.json()['id']}"), client.get(f"/runs/{made.json()['id']}")):
            assert reader.status_code == 200 and "hf_do-not-show-me" not in reader.text
    assert any("HF_TOKEN in engine.env" in record.getMessage() for record in caplog.records)
