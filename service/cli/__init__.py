"""The `kvcanary` command: serve, run here, submit from CI, tokens, baselines, database.

`submit` is all a CI job needs, and `pip install kvcanary` without extras gives only its
dependencies: the commands that act on a database or start an engine import the server's
modules inside themselves. Each command group has its module in this package; this one puts
them together as `app`, the `kvcanary` console script.
"""

from __future__ import annotations

import typer

from service.cli import catalog, doctor, host, local_run, mutation, release, submit
from service.runs.cli import app as runs_app
from service.scheduling.cli import app as schedules_app

app = typer.Typer(help="kvcanary: end-to-end accuracy gate for vLLM attention kernels", no_args_is_help=True)
app.add_typer(host.db_app, name="db")
app.add_typer(host.tokens_app, name="tokens")
app.add_typer(host.baselines_app, name="baselines")
app.add_typer(catalog.profiles_app, name="profiles")
app.add_typer(schedules_app, name="schedules")
app.add_typer(runs_app, name="runs")
app.command()(host.serve)
app.command()(local_run.run)
app.command()(submit.submit)
app.command("release-report")(release.release_report)
app.command()(mutation.mutants)
app.command()(doctor.doctor)
