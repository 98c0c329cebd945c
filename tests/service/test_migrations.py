"""The Alembic migrations build exactly the schema the ORM models declare.

A model changed without a migration (or a migration without its model) passes every test
that creates tables through the migrations until a deployed database disagrees with the
code; autogenerate's comparison finds the difference here first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Column, Integer, MetaData, Table, create_engine

from service.db.migrate import upgrade
from service.db.models import Base


def _differences(connection: Any, metadata: MetaData) -> list[Any]:
    """Autogenerate's differences, leaving out what the models build on another database only
    (`ddl_if(dialect=...)`, which Alembic's comparison does not read)."""
    dialect = connection.dialect.name

    def built_here(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        only = getattr(obj, "_ddl_if", None)
        return only is None or only.dialect in (None, dialect)

    context = MigrationContext.configure(connection, opts={"compare_type": True, "include_object": built_here})
    return list(compare_metadata(context, metadata))


def test_migrations_at_head_match_the_models(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            differences = _differences(connection, Base.metadata)
    finally:
        engine.dispose()
    assert differences == [], f"the models and the migrations disagree; add a migration for: {differences}"


def test_a_model_change_without_a_migration_is_found(tmp_path: Path) -> None:
    """The check above can fail: a column the migrations never added is reported."""
    url = f"sqlite:///{tmp_path / 'kvcanary.db'}"
    upgrade(url)
    changed = MetaData()
    for table in Base.metadata.tables.values():
        table.to_metadata(changed)
    Table("runs", changed, Column("unmigrated", Integer), extend_existing=True)
    engine = create_engine(url)
    with engine.connect() as connection:
        differences = _differences(connection, changed)
    engine.dispose()
    added = [d[3].name for d in differences if d[0] == "add_column"]  # (a copy's indexes lose ddl_if)
    assert added == ["unmigrated"], differences
