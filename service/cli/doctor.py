"""`kvcanary doctor`: what the database holds that today's checks would refuse, and batches to settle."""

from __future__ import annotations

from typing import Annotated

import typer

from service.cli.common import EXIT_PASS, EXIT_REGRESSION, console, prepared_db


def doctor(
    settle: Annotated[
        bool, typer.Option(help="Compute the matrix of every mutation batch whose run ended without one")
    ] = False,
) -> None:
    """List stored label values that render like another (a zero-width or bidi character, NFD
    instead of NFC), each beside the values it looks like. Exit 0 when there is none, 1 when there is."""
    from service.db.session import session_scope
    from service.releases.lookalikes import lookalikes
    from service.runs.batches import settle_run, unsettled

    url = prepared_db()
    with session_scope(url, write=False) as session:
        found = lookalikes(session)
    for item in found:
        like = ", ".join(f"{value!a} ({runs} runs)" for value, runs in item.looks_like)
        what = f": {item.problem}" if item.problem else ""
        console.print(
            f"label {item.key}={item.value!a} ({item.runs} runs){what}; looks like {like or 'no other value'}",
            markup=False,
        )
    if settle:
        with session_scope(url) as session:
            for run_id in unsettled(session):
                settle_run(session, run_id)
                console.print(f"mutation batch of run {run_id}: matrix computed", markup=False)
    if not found:
        console.print("no stored label value renders like another", markup=False)
    raise typer.Exit(EXIT_REGRESSION if found else EXIT_PASS)
