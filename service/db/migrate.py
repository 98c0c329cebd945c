"""Apply Alembic migrations from code, so `kvcanary db upgrade` and service start share one path."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    if url.startswith("sqlite:///"):
        create_private_file(Path(url.removeprefix("sqlite:///")))
    command.upgrade(alembic_config(url), revision)


def create_private_file(path: Path) -> None:
    """The SQLite file as 0600 in a 0700 folder: tokens' hashes and runs are nobody else's to read.

    SQLite gives its -wal and -shm files the database file's mode, so they follow.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        path.touch(mode=0o600)
