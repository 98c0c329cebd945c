"""`kvcanary schedules list|enable|disable|fire-now`, straight against the configured database.

The database layer is imported inside the commands: the client's `kvcanary --help` lists them
without the server's packages installed.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table

from service.report import cli_console
from service.settings import get_settings

app = typer.Typer(help="Nightly schedules", no_args_is_help=True)
console = cli_console()
EXIT_QUEUED, EXIT_SKIPPED, EXIT_ERROR = 0, 1, 2


def _db() -> str:
    from service.db.migrate import upgrade

    url = get_settings().resolved_database_url()
    upgrade(url)
    return url


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else "-"


@app.command("list")
def list_() -> None:
    """Every schedule with its next and last fire and what the last fire did."""
    from service.db.session import session_scope
    from service.scheduling import schedules

    with session_scope(_db()) as session:
        rows = schedules.list_schedules(session)
    table = Table("name", "profile", "cron", "zone", "enabled", "next fire", "last fire", "source")
    for s in rows:
        last = s.recent_fires[0] if s.recent_fires else None
        outcome = "-" if last is None else (f"run {last.run_id}" if last.run_id else f"skipped: {last.skipped_reason}")
        table.add_row(
            s.name,
            s.profile,
            s.cron,
            s.timezone,
            "yes" if s.enabled else "no",
            _when(s.next_fire_at),
            f"{_when(s.last_fire_at)} {outcome}",
            "api/cli" if s.overridden else "profile",
        )
    console.print(table if rows else "no schedules: add a `schedule:` block to a profile, or PUT /api/v1/schedules")


def _set_enabled(name: str, enabled: bool) -> None:
    from service.db.session import session_scope
    from service.profile_catalog import configured_profiles
    from service.profiles import ProfileError
    from service.scheduling import schedules
    from service.scheduling.schemas import ScheduleUpdate

    settings = get_settings()
    try:
        profiles = configured_profiles(settings)
        with session_scope(_db()) as session:
            out = schedules.update(session, ScheduleUpdate(name=name, enabled=enabled), profiles)
    except (schedules.ScheduleError, ProfileError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
    state = f"enabled, next fire {_when(out.next_fire_at)}" if out.enabled else "disabled"
    console.print(f"schedule {name} {state}; profile changes to its schedule block no longer apply to it")


@app.command()
def enable(name: str) -> None:
    """Switch a schedule on (kept across restarts, whatever its profile says)."""
    _set_enabled(name, True)


@app.command()
def disable(name: str) -> None:
    """Switch a schedule off (kept across restarts, whatever its profile says)."""
    _set_enabled(name, False)


@app.command("fire-now")
def fire_now(
    name: str,
    by: Annotated[str, typer.Option(help="Recorded as who triggered the run")] = os.environ.get("USER", "cli"),
) -> None:
    """Fire a schedule at this second, as its cron would. Exit 0 queued, 1 skipped (reason printed), 2 error."""
    from service.db.models import utcnow
    from service.db.session import session_scope
    from service.profile_catalog import configured_profiles
    from service.profiles import ProfileError
    from service.scheduling import schedules

    settings = get_settings()
    url = _db()
    try:
        profiles = configured_profiles(settings)
        with session_scope(url) as session:
            schedule_id = schedules.get(session, name).id
    except (schedules.ScheduleError, ProfileError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
    fired = schedules.fire(url, schedule_id, utcnow().replace(microsecond=0), profiles, f"fire-now by {by}")
    if fired is None:
        console.print("[red]this schedule already fired at this second; try again[/red]")
        raise typer.Exit(EXIT_ERROR)
    if fired.run_id is None:
        console.print(f"schedule {name}: {fired.skipped_reason}")
        raise typer.Exit(EXIT_SKIPPED)
    console.print(f"schedule {name}: run {fired.run_id} queued")
