"""`python -m service` is the `kvcanary` command, for environments without the console script."""

from service.cli import app

app()
