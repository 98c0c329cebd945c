"""`kvcanary run`: one profile on this host, without a service: engine, suites, verdict, a table.

The run is queued and claimed in the configured database and executed by the pipeline a
service's worker runs, started on a thread in `run` (the command line's one call into
`service.runs.pipeline`), so the dashboard can show it later.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from service.cli.common import (
    COMPARE_HELP,
    EXIT_ERROR,
    EXPECT_HELP,
    FRESH_ENGINES_HELP,
    checked_labels,
    compare_arms,
    console,
    exit_code,
    expectations,
    loaded_profiles,
    prepared_db,
)
from service.report import print_run, write_junit


def run(
    profile: str,
    limit: Annotated[int | None, typer.Option(help="Cap every suite at this many items")] = None,
    variant: Annotated[str | None, typer.Option(help="Kernel variant: fixed, legacy, stock or a mutant")] = None,
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable")] = None,
    junit: Annotated[Path | None, typer.Option(help="Write a JUnit XML report here")] = None,
    compare: Annotated[list[str] | None, typer.Option(help=COMPARE_HELP)] = None,
    expect: Annotated[list[str] | None, typer.Option(help=EXPECT_HELP)] = None,
    fresh_engines: Annotated[bool, typer.Option(help=FRESH_ENGINES_HELP)] = False,
) -> None:
    """Run one profile here, without the service: engine, suites, verdict, a result table."""
    from service import baselines
    from service.db.models import Run
    from service.db.session import session_scope
    from service.private_files import keep_private
    from service.profiles import ArmSpec, RunOverrides
    from service.runs import pipeline, queries, queue
    from service.runs.admission import admit
    from service.runs.gate_grade import HOST, exploratory_reasons, stamp
    from service.runs.worker import new_worker_id
    from service.settings import get_settings

    labels = checked_labels(label or [])
    keep_private()
    settings = get_settings()
    url = prepared_db()
    profiles = loaded_profiles(settings)
    if profile not in profiles:
        console.print(f"[red]unknown profile {profile!r}; known profiles: {', '.join(sorted(profiles))}[/red]")
        raise typer.Exit(EXIT_ERROR)
    try:
        overrides = RunOverrides.model_validate(
            {"limit": limit, "kernel_variant": variant, "arm_engines": "fresh" if fresh_engines else None}
        )
        arms = [ArmSpec.model_validate(name) for name in compare_arms(compare)] if compare else None
        expected = expectations(expect) if expect else None
        admitted = admit(profiles[profile], overrides, arms, expected, on_this_host=True)
    except ValueError as exc:  # RunRefused, and the options' own validation errors
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
    worker_id = new_worker_id()
    with session_scope(url) as session:
        baselines.seed_from_profiles(session, profiles)
        queued, _ = queue.enqueue(
            session,
            profile=profile,
            trigger="manual",
            triggered_by=os.environ.get("USER", "cli"),
            labels=labels,
            overrides=overrides.model_dump(exclude_none=True),
            arms=admitted.plan.stored_arms(),
            expect=admitted.plan.expect,
            max_attempts=1,
            profile_snapshot=admitted.snapshot(),
        )
        stamp(queued, HOST, exploratory_reasons(profiles[profile], overrides, arms, expected))
        session.flush()
        run_id = queued.id
        queue.claim_next(session, worker_id, run_id)
    console.print(f"run {run_id}: profile {profile}, folder {settings.runs_dir() / str(run_id)}")
    worker = threading.Thread(target=pipeline.run_claimed, args=(run_id, settings, profiles, worker_id), daemon=True)
    worker.start()
    _follow(url, run_id, worker)
    with session_scope(url) as session:
        row = session.get(Run, run_id)
        assert row is not None
        detail = queries.run_detail(session, row)
    print_run(detail, console)
    if junit:
        write_junit(detail, junit)
    raise typer.Exit(exit_code(detail))


def _follow(url: str, run_id: int, worker: threading.Thread) -> None:
    """A progress bar fed from the run row, which is what the service and dashboard read too."""
    from service.db.models import Run
    from service.db.session import session_scope

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("queued", total=None)
        while worker.is_alive():
            with session_scope(url) as session:
                row = session.get(Run, run_id)
                assert row is not None
                phase = row.progress_phase or row.status
                bar.update(
                    task,
                    description=f"{row.status}: {phase}",
                    completed=row.progress_done,
                    total=row.progress_total or None,
                )
            worker.join(0.5)
