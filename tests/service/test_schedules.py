"""Schedules on one real database: fired by schedulers on a clock the test moves, and by `kvcanary serve`.

Schedulers here tick on a `ManualClock`, so a test walks through half a minute of fires in
well under a second of real time; the services run with the worker off, so queued runs stay
queued (no engine is started). Where a test needs the previous nightly run out of the way it
cancels it through the state machine, as a finished worker would have ended it. Schedules here
fire every 5 seconds (a sixth, seconds field in the cron expression).
"""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
import yaml
from pydantic import ValidationError
from sqlalchemy import select
from typer.testing import CliRunner

from service.auth import Role, create_token
from service.db.models import Run, Schedule, ScheduleFire
from service.db.session import session_scope
from service.profiles import ProfileError, load_profiles
from service.runs.state import Status, transition
from service.scheduling import cron, schedules
from service.scheduling.loop import Scheduler
from service.scheduling.schemas import ScheduleUpdate
from service.settings import PACKAGED_PROFILES, Settings, get_settings
from tests.service.conftest import StartService

PROFILE = "nightly-fixture"
EVERY_5_S = "* * * * * */5"
PERIOD = timedelta(seconds=5)
RACERS = 3


def write_profile(folder: Path, cron_expression: str = EVERY_5_S, enabled: bool = True, **schedule: Any) -> Path:
    """A profile whose runs never start here (worker off); only its schedule block matters."""
    folder.mkdir(parents=True, exist_ok=True)
    block = {"cron": cron_expression, "timezone": "UTC", "enabled": enabled, "labels": {"vllm_version": "0.24.0"}}
    profile = {
        "model": "fixture:gsm8k-tiny",
        "served_model_name": PROFILE,
        "suites": [{"suite": "wer", "manifest": "clips.jsonl"}],
        "schedule": {**block, **schedule},
    }
    (folder / f"{PROFILE}.yaml").write_text(yaml.safe_dump(profile))
    return folder


def service_env(database_url: str, profiles: Path) -> dict[str, str]:
    return {
        "KVCANARY_DATABASE_URL": database_url,
        "KVCANARY_PROFILES_DIR": str(profiles),
        "KVCANARY_NIGHTLY": "true",
        "KVCANARY_SCHEDULER_TICK_S": "0.5",
    }


def token(url: str, role: Role) -> str:
    with session_scope(url) as session:
        return create_token(session, f"test-{role.value}", role)


def fires(url: str) -> list[ScheduleFire]:
    with session_scope(url) as session:
        return list(session.scalars(select(ScheduleFire).order_by(ScheduleFire.fire_time)))


def nightly_runs(url: str) -> list[Run]:
    with session_scope(url) as session:
        return list(session.scalars(select(Run).where(Run.trigger == "nightly").order_by(Run.id)))


def cancel_queued(url: str) -> None:
    with session_scope(url) as session:
        for run in session.scalars(select(Run).where(Run.status == Status.QUEUED.value)):
            transition(session, run, Status.CANCELLED, "test: ended so the next fire may queue")


class ManualClock:
    """A clock that stands still until the test moves it: the schedulers' `now`."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


# A few seconds past a fire time, as a service started at any moment would be.
START = datetime(2030, 1, 1, 2, 0, 1, 300_000, tzinfo=UTC)


def scheduler(database_url: str, profiles_dir: Path, clock: ManualClock) -> Scheduler:
    """A service's scheduler on `clock`, its profile blocks synced as at service start."""
    settings = Settings(database_url=database_url, profiles_dir=profiles_dir, nightly=True)
    started = Scheduler(settings, load_profiles(profiles_dir), clock)
    started.sync()
    return started


def tick_together(schedulers: list[Scheduler]) -> None:
    """Every scheduler ticks at once, in its own thread, as separate services race on one database."""
    threads = [threading.Thread(target=s.tick) for s in schedulers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


def test_two_schedulers_fire_every_due_time_exactly_once(database_url: str, tmp_path: Path) -> None:
    profiles_dir = write_profile(tmp_path / "profiles")
    clock = ManualClock(START)
    services = [scheduler(database_url, profiles_dir, clock) for _ in range(2)]
    for _ in range(60):  # half a minute in half-second ticks
        clock.advance(0.5)
        tick_together(services)
        cancel_queued(database_url)  # a worker finished the run, so the next fire may queue

    seen = fires(database_url)
    times = [f.fire_time for f in seen]
    assert len(times) == 6, times
    assert all(b - a == PERIOD for a, b in itertools.pairwise(times)), f"a fire missed or doubled: {times}"
    assert [f.skipped_reason for f in seen if f.skipped_reason] == []
    runs = nightly_runs(database_url)
    assert sorted(f.run_id for f in seen if f.run_id is not None) == [r.id for r in runs]
    assert all(r.labels == {"vllm_version": "0.24.0", "schedule": PROFILE} for r in runs)


def test_catch_up_after_downtime_queues_one_run_and_later_fires_wait_for_it(database_url: str, tmp_path: Path) -> None:
    profiles_dir = write_profile(tmp_path / "profiles")
    clock = ManualClock(START)
    first = scheduler(database_url, profiles_dir, clock)
    clock.advance(4)
    [fired] = first.tick()
    assert fired.run_id is not None, fired.skipped_reason
    cancel_queued(database_url)
    runs_before = len(nightly_runs(database_url))
    last_before = fires(database_url)[-1].fire_time

    clock.advance(17)  # three fire times pass while no service runs
    restarted = scheduler(database_url, profiles_dir, clock)  # the service starts again
    restarted_at = clock()
    restarted.tick()
    for _ in range(14):  # one more regular fire after the catch-up
        clock.advance(0.5)
        restarted.tick()

    after = [f for f in fires(database_url) if f.fire_time > last_before]
    catch_up, later = after[0], after[1:]
    assert catch_up.run_id is not None, catch_up.skipped_reason
    assert catch_up.fire_time - last_before >= 3 * PERIOD  # the missed times were not fired one by one ...
    assert catch_up.fire_time == cron.latest_due(EVERY_5_S, "UTC", restarted_at)  # ... only the latest was
    assert len(nightly_runs(database_url)) == runs_before + 1
    assert later, "the restarted scheduler made no regular fire"
    for fire in later:
        assert fire.run_id is None
        assert f"nightly run {catch_up.run_id} of {PROFILE} is still queued" in fire.skipped_reason


def test_an_every_second_schedule_blocked_by_its_run_writes_one_row_for_its_skips(
    database_url: str, tmp_path: Path
) -> None:
    """Skipped fires are coalesced: one row per run of skips for one reason, not one a second."""
    profiles_dir = write_profile(tmp_path / "profiles", "* * * * * *")
    clock = ManualClock(START)
    service = scheduler(database_url, profiles_dir, clock)
    for _ in range(60):  # a minute of one-second fires; the first queues a run nobody starts
        clock.advance(1)
        service.tick()
    [queued, skipped] = fires(database_url)
    assert queued.run_id is not None and skipped.run_id is None
    assert skipped.skipped_fires == 59 and skipped.first_fire_time == queued.fire_time + timedelta(seconds=1)
    assert f"nightly run {queued.run_id} of {PROFILE} is still queued" in skipped.skipped_reason
    cancel_queued(database_url)
    clock.advance(1)
    service.tick()
    assert len(fires(database_url)) == 3 and fires(database_url)[-1].run_id is not None


@pytest.mark.parametrize(
    "expression", ["0 2 * * * * 2027", "*/99999999999 * * * *", "*/61 * * * *", "@daily", "0 2 L * *"]
)
def test_cron_strings_outside_the_documented_forms_are_refused(expression: str) -> None:
    with pytest.raises(cron.CronError, match="invalid cron expression"):
        cron.validate(expression, "UTC")
    with pytest.raises(ValidationError):
        ScheduleUpdate(name=PROFILE, cron=expression)


def test_serve_runs_the_scheduler_on_the_wall_clock(
    start_service: StartService, database_url: str, tmp_path: Path
) -> None:
    env = service_env(database_url, write_profile(tmp_path / "profiles", "* * * * * *"))  # every second
    start_service(**env)
    deadline = time.monotonic() + 30
    while not fires(database_url) and time.monotonic() < deadline:
        time.sleep(0.1)
    [first, *_] = fires(database_url)
    assert first.run_id is not None, first.skipped_reason


def _race(url: str, profiles_dir: str, fire_time: datetime, barrier: Any, out: Any) -> None:
    profiles = load_profiles(Path(profiles_dir))
    with session_scope(url) as session:
        schedule_id = schedules.get(session, PROFILE).id
    barrier.wait(60)
    fired = schedules.fire(url, schedule_id, fire_time, profiles, f"racer {multiprocessing.current_process().name}")
    out.put(None if fired is None else fired.run_id)


@pytest.mark.slow
def test_processes_racing_for_one_fire_queue_one_run(database_url: str, tmp_path: Path) -> None:
    profiles_dir = write_profile(tmp_path / "profiles")
    schedules.sync_from_profiles(database_url, load_profiles(profiles_dir), nightly=True)
    fire_time = datetime(2030, 1, 1, 2, 0, tzinfo=UTC)
    spawn = multiprocessing.get_context("spawn")  # fresh processes, as separate services would be
    barrier, out = spawn.Barrier(RACERS), spawn.Queue()
    args = (database_url, str(profiles_dir), fire_time, barrier, out)
    racers = [spawn.Process(target=_race, args=args) for _ in range(RACERS)]
    for racer in racers:
        racer.start()
    results = [out.get(timeout=120) for _ in racers]
    for racer in racers:
        racer.join(10)

    winners = [r for r in results if r is not None]
    assert len(winners) == 1, results
    assert [r.id for r in nightly_runs(database_url)] == winners
    assert [(f.fire_time, f.run_id) for f in fires(database_url)] == [(fire_time, winners[0])]


def test_profile_blocks_follow_the_nightly_switch_until_overridden(database_url: str, tmp_path: Path) -> None:
    profiles = load_profiles(write_profile(tmp_path / "profiles", "0 2 * * *", timezone="Europe/Berlin"))

    def row() -> Schedule:
        with session_scope(database_url) as session:
            return schedules.get(session, PROFILE)

    schedules.sync_from_profiles(database_url, profiles, nightly=False)
    assert (row().enabled, row().next_fire_at) == (False, None)  # the embedded default: nothing fires

    schedules.sync_from_profiles(database_url, profiles, nightly=True)
    synced = row()
    assert synced.enabled and synced.next_fire_at is not None
    assert synced.next_fire_at.astimezone(ZoneInfo("Europe/Berlin")).hour == 2
    schedules.sync_from_profiles(database_url, profiles, nightly=True)
    assert row().next_fire_at == synced.next_fire_at  # a restart keeps a pending (possibly missed) fire

    with session_scope(database_url) as session:
        change = ScheduleUpdate(name=PROFILE, enabled=False, cron="0 3 * * *")
        schedules.update(session, change, profiles)
    schedules.sync_from_profiles(database_url, profiles, nightly=True)
    assert (row().enabled, row().cron, row().overridden) == (False, "0 3 * * *", True)

    with pytest.raises(ProfileError, match=r"nightly-fixture\.yaml: schedule: .*invalid cron expression"):
        load_profiles(write_profile(tmp_path / "bad", "every night"))


def test_cron_is_read_in_the_schedules_time_zone_across_daylight_saving() -> None:
    winter = datetime(2030, 1, 10, 12, tzinfo=UTC)
    summer = datetime(2030, 7, 10, 12, tzinfo=UTC)
    assert cron.next_after("0 2 * * *", "Europe/Berlin", winter) == datetime(2030, 1, 11, 1, tzinfo=UTC)
    assert cron.next_after("0 2 * * *", "Europe/Berlin", summer) == datetime(2030, 7, 11, 0, tzinfo=UTC)
    assert cron.latest_due("0 2 * * *", "Europe/Berlin", summer) == datetime(2030, 7, 10, 0, tzinfo=UTC)
    with pytest.raises(cron.CronError, match="unknown time zone"):
        cron.validate("0 2 * * *", "Mars/Olympus")


def test_schedules_api_lists_and_only_admins_override(
    start_service: StartService, database_url: str, tmp_path: Path
) -> None:
    env = service_env(database_url, write_profile(tmp_path / "profiles", "0 2 * * *"))
    service = start_service(**env)
    url = f"{service.url}/api/v1/schedules"
    [listed] = httpx.get(url).json()
    assert (listed["name"], listed["enabled"], listed["overridden"]) == (PROFILE, True, False)
    assert listed["next_fire_at"] is not None and listed["recent_fires"] == []

    change = {"name": PROFILE, "enabled": False}
    assert httpx.put(url, json=change).status_code == 401
    ci = {"Authorization": f"Bearer {token(database_url, Role.CI)}"}
    assert httpx.put(url, json=change, headers=ci).status_code == 403
    admin = {"Authorization": f"Bearer {token(database_url, Role.ADMIN)}"}
    changed = httpx.put(url, json=change, headers=admin).json()
    assert (changed["enabled"], changed["next_fire_at"], changed["overridden"]) == (False, None, True)

    new = {"name": "extra", "profile": PROFILE, "cron": "30 1 * * *", "timezone": "Asia/Tokyo", "enabled": True}
    created = httpx.put(url, json=new, headers=admin).json()
    assert created["next_fire_at"] is not None and created["timezone"] == "Asia/Tokyo"
    unknown = httpx.put(url, json={**new, "name": "x", "profile": "nope"}, headers=admin)
    assert unknown.status_code == 422 and "unknown profile 'nope'" in unknown.text
    bad = httpx.put(url, json={"name": PROFILE, "cron": "61 * * * *"}, headers=admin)
    assert bad.status_code == 422 and "invalid cron expression" in bad.text
    assert [s["name"] for s in httpx.get(url).json()] == ["extra", PROFILE]


def test_cli_lists_enables_disables_and_fires_now(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.cli import app

    for key, value in service_env(database_url, write_profile(tmp_path / "profiles", "0 2 * * *")).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KVCANARY_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("COLUMNS", "300")  # rich would wrap messages at 80 columns
    get_settings.cache_clear()
    schedules.sync_from_profiles(database_url, load_profiles(tmp_path / "profiles"), nightly=True)
    cli = CliRunner()
    try:
        disabled = cli.invoke(app, ["schedules", "disable", PROFILE])
        assert disabled.exit_code == 0 and "disabled" in disabled.output
        listed = cli.invoke(app, ["schedules", "list"])
        assert listed.exit_code == 0 and PROFILE in listed.output and "api/cli" in listed.output
        enabled = cli.invoke(app, ["schedules", "enable", PROFILE])
        assert enabled.exit_code == 0 and "next fire" in enabled.output

        first = cli.invoke(app, ["schedules", "fire-now", PROFILE, "--by", "release-manager"])
        assert first.exit_code == 0, first.output
        [run] = nightly_runs(database_url)
        assert f"run {run.id} queued" in first.output and run.triggered_by == "fire-now by release-manager"
        later = datetime.now(UTC) + timedelta(seconds=2)  # the next fire-now is at a different second
        monkeypatch.setattr("service.db.models.utcnow", lambda: later)
        second = cli.invoke(app, ["schedules", "fire-now", PROFILE])
        assert second.exit_code == 1 and f"nightly run {run.id}" in second.output
        missing = cli.invoke(app, ["schedules", "enable", "no-such-schedule"])
        assert missing.exit_code == 2 and "known schedules: nightly-fixture" in missing.output
    finally:
        get_settings.cache_clear()


def test_shipped_nightly_schedules_are_off_until_the_nightly_switch(database_url: str) -> None:
    shipped = load_profiles(PACKAGED_PROFILES)
    nightly = {"kimi-linear-48b-a3b", "whisper-large-v3"}
    assert nightly <= {name for name, p in shipped.items() if p.schedule is not None}
    schedules.sync_from_profiles(database_url, shipped, nightly=False)
    with session_scope(database_url) as session:
        assert {s.name for s in schedules.list_schedules(session) if s.enabled} == set()
    schedules.sync_from_profiles(database_url, shipped, nightly=True)
    with session_scope(database_url) as session:
        on = {s.name: s for s in schedules.list_schedules(session) if s.enabled}
    assert nightly <= set(on) and all(on[name].next_fire_at is not None for name in nightly)
