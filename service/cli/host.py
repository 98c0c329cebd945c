"""Commands an operator runs on the service's host: `serve`, `db`, `tokens` and `baselines`.

They act on the configured database (or start the service on it), so they import the server's
modules inside themselves: the client's `kvcanary --help` lists them without those installed.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Annotated

import typer

from service.cli.common import EXIT_ERROR, console, loaded_profiles, prepared_db
from service.durations import EXAMPLES, parse_duration
from service.roles import Role

db_app = typer.Typer(help="Database schema", no_args_is_help=True)
tokens_app = typer.Typer(help="API tokens", no_args_is_help=True)
baselines_app = typer.Typer(help="Baselines and reference runs", no_args_is_help=True)


def _expiry(expires_in: str | None, expires: datetime | None) -> datetime | None:
    """`--expires-in 90d` (d, h or m) or `--expires 2027-01-31`, as a UTC instant."""
    if expires_in and expires:
        raise typer.BadParameter("give --expires-in or --expires, not both")
    if expires is not None:
        return expires if expires.tzinfo else expires.replace(tzinfo=UTC)
    if not expires_in:
        return None
    try:
        return datetime.now(UTC) + parse_duration(expires_in, "--expires-in")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (KVCANARY_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (KVCANARY_PORT)")] = None,
) -> None:
    """Start the API, dashboard and local worker; migrations are applied on start."""
    import uvicorn

    from service.app import create_app
    from service.private_files import keep_private
    from service.serving import protocol
    from service.settings import get_settings

    keep_private()  # run folders, logs and the database are the service user's alone
    settings = get_settings()
    uvicorn.run(
        create_app(settings),
        host=host or settings.host,
        port=port or settings.port,
        log_level="info",
        http=protocol(settings),  # header deadline and per-client connection cap (service.serving)
    )


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply all migrations to the configured database."""
    console.print(f"database at {prepared_db()} is up to date")


@tokens_app.command("create")
def tokens_create(
    role: Annotated[Role, typer.Option(help="viewer reads; ci also triggers runs; admin also edits baselines")],
    name: Annotated[
        str | None, typer.Option(help="Who or what holds it, e.g. github-actions; unique (default: role-<random>)")
    ] = None,
    expires_in: Annotated[str | None, typer.Option(help=f"Lifetime, e.g. {EXAMPLES}")] = None,
    expires: Annotated[
        datetime | None, typer.Option(help="Expiry date or time (UTC unless given), e.g. 2027-01-31")
    ] = None,
) -> None:
    """Print a new API token once; only its hash is stored."""
    import secrets

    from service.auth import TokenRefused, create_token
    from service.db.session import session_scope

    expires_at = _expiry(expires_in, expires)
    name = name or f"{role.value}-{secrets.token_hex(3)}"
    try:
        with session_scope(prepared_db()) as session:
            token = create_token(session, name, role, expires_at)
    except TokenRefused as exc:
        raise typer.BadParameter(str(exc)) from exc
    until = f", valid until {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at else ""
    console.print(f"created {role.value} token {name!r}{until}; store it now, it is not shown again:")
    print(token)


@tokens_app.command("list")
def tokens_list() -> None:
    """Every token: id, name, role, state, expiry and last use (never the secret)."""
    from service.auth import list_tokens
    from service.db.models import utcnow
    from service.db.session import session_scope

    now = utcnow()
    with session_scope(prepared_db(), write=False) as session:
        rows = list_tokens(session)
    for row in rows:
        state = "revoked" if row.revoked else "expired" if row.expires_at and row.expires_at <= now else "active"
        expiry = f"{row.expires_at:%Y-%m-%d %H:%M}" if row.expires_at else "never"
        used = f"{row.last_used_at:%Y-%m-%d %H:%M}" if row.last_used_at else "never"
        print(f"{row.id}\t{row.name}\t{row.role}\t{state}\texpires {expiry}\tlast used {used}")


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[int, typer.Argument(help="The id `kvcanary tokens list` shows")]) -> None:
    """Revoke a token; the next request that presents it gets 401."""
    from service.auth import revoke
    from service.db.session import session_scope

    with session_scope(prepared_db()) as session:
        row = revoke(session, token_id)
    if row is None:
        console.print(f"[red]no token with id {token_id}; see `kvcanary tokens list`[/red]")
        raise typer.Exit(EXIT_ERROR)
    console.print(f"revoked token {token_id} ({row.name}, {row.role})")


@baselines_app.command("list")
def baselines_list(profile: Annotated[str | None, typer.Argument()] = None) -> None:
    from service import baselines
    from service.db.session import session_scope

    with session_scope(prepared_db()) as session:
        for b in baselines.list_baselines(session, profile):
            console.print(
                f"{b.profile} {b.suite}.{b.metric}: {b.value} ({b.direction}, {b.tolerance_kind} {b.tolerance}) "
                f"reference run {b.reference_run_id or '-'} — {b.source}"
            )


@baselines_app.command("promote")
def baselines_promote(
    run_id: int, by: Annotated[str, typer.Option(help="Recorded in the history")] = os.environ.get("USER", "cli")
) -> None:
    """Make a finished run the paired reference for every metric it reported."""
    from service import baselines
    from service.db.session import session_scope
    from service.settings import get_settings

    settings = get_settings()
    profiles = loaded_profiles(settings)
    with session_scope(prepared_db()) as session:
        try:
            changed = baselines.promote(session, run_id, by, profiles)
        except baselines.BaselineError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(EXIT_ERROR) from exc
    for b in changed:
        console.print(f"{b.profile} {b.suite}.{b.metric}: reference run is now {b.reference_run_id}")
