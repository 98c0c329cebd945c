"""`kvcanary runs delete`, straight against the configured database, like `kvcanary tokens`.

The database layer is imported inside the command: the client's `kvcanary --help` lists it
without the server's packages installed.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from service.report import cli_console

app = typer.Typer(help="Runs kept in the database", no_args_is_help=True)
console = cli_console()
EXIT_DONE, EXIT_ERROR = 0, 2


@app.command("delete")
def delete(
    run_id: Annotated[int, typer.Argument(min=1, help="The run's id, as the API and dashboard show it")],
) -> None:
    """Delete an ended run with its samples, results and folder; an audit event records who did.

    A queued or running run is refused: cancel it (API or dashboard), then delete it once it has ended.
    """
    from service.db.migrate import upgrade
    from service.db.session import session_scope
    from service.runs import removal
    from service.settings import get_settings

    settings = get_settings()
    url = settings.resolved_database_url()
    upgrade(url)
    try:
        with session_scope(url) as session:
            event = removal.delete_run(session, run_id, f"cli {os.environ.get('USER', 'unknown')}")
    except (removal.RunNotFound, removal.RunInUse) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
    removal.remove_folder(event, settings.runs_dir())
    console.print(f"deleted run {run_id} ({event.detail['profile']}, {event.detail['status']}); audit event {event.id}")
