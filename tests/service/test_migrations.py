"""The Alembic migrations build exactly the schema the ORM models declare.

A model changed without a migration (or a migration without its model) passes every test
that creates tables through the migrations until a deployed database disagrees with the
code; autogenerate's comparison finds the difference here first.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Column, Integer, MetaData, Table, create_engine

from service.db.migrate import alembic_config, upgrade
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


def _filled(table: Table, **given: Any) -> dict[str, Any]:
    """`given`, and a plain value for every other NOT NULL column without a default."""
    plain = {sa.Integer: 1, sa.String: "x", sa.Text: "x", sa.Boolean: False, sa.Float: 0.0, sa.JSON: {}}
    row = dict(given)
    for column in table.columns:
        if column.name in row or column.nullable or column.server_default is not None or column.primary_key:
            continue
        if isinstance(column.type, sa.DateTime):
            row[column.name] = datetime.now(UTC)
            continue
        row[column.name] = next(v for t, v in plain.items() if isinstance(column.type, t))
    return row


def test_wer_columns_move_into_data_and_back(empty_database: str) -> None:
    """0010 moves a sample's word counts into data["wer"] (its severity: the word errors) and
    drops the columns; downgrade puts them back. Other samples and data keys stay as they were."""
    upgrade(empty_database, "0009_run_profile_snapshot")
    engine = create_engine(empty_database)
    counts = {"substitutions": 2, "deletions": 1, "insertions": 0, "ref_words": 9}
    try:
        with engine.begin() as connection:
            runs, samples = (Table(name, MetaData(), autoload_with=connection) for name in ("runs", "samples"))
            run_id = connection.execute(sa.insert(runs).values(_filled(runs))).inserted_primary_key[0]
            for row in (
                _filled(samples, run_id=run_id, suite="wer", key="u1", data={"kept": 1}, word_errors=3, **counts),
                _filled(samples, run_id=run_id, suite="drift", key="p1", data={"floor": {}}, severity=0.5),
            ):
                connection.execute(sa.insert(samples).values(row))
        upgrade(empty_database)
        with engine.connect() as connection:
            table = Table("samples", MetaData(), autoload_with=connection)
            rows = {r.key: r for r in connection.execute(sa.select(table))}
        assert "word_errors" not in table.columns and "ref_words" not in table.columns
        assert (rows["u1"].data, rows["u1"].severity) == ({"kept": 1, "wer": counts}, 3.0)
        assert (rows["p1"].data, rows["p1"].severity) == ({"floor": {}}, 0.5)
        command.downgrade(alembic_config(empty_database), "0009_run_profile_snapshot")
        with engine.connect() as connection:
            table = Table("samples", MetaData(), autoload_with=connection)
            rows = {r.key: r for r in connection.execute(sa.select(table))}
        back = rows["u1"]
        assert (back.data, back.severity, back.word_errors) == ({"kept": 1}, None, 3)
        assert {name: getattr(back, name) for name in counts} == counts
        assert (rows["p1"].data, rows["p1"].severity, rows["p1"].ref_words) == ({"floor": {}}, 0.5, None)
    finally:
        engine.dispose()


def test_stored_runs_get_a_role_a_gate_grade_and_batch_records(empty_database: str) -> None:
    """0011: each run's role from its token (scheduler for a schedule fire, host without a token);
    a limit override or a batch label makes it exploratory; a batch label queued by an admin or on
    the host becomes a batch record, one queued by a ci token does not."""
    upgrade(empty_database, "0010_wer_into_data")
    engine = create_engine(empty_database)
    try:
        with engine.begin() as connection:
            runs, tokens = (Table(name, MetaData(), autoload_with=connection) for name in ("runs", "api_tokens"))
            ids: dict[str, int] = {}
            for role in ("ci", "admin"):
                row = _filled(tokens, name=f"{role}-bot", role=role, token_hash=role * 10)
                ids[role] = connection.execute(sa.insert(tokens).values(row).returning(tokens.c.id)).scalar_one()
            arms: list[dict[str, Any]] = [{"name": n, "variant": n, "engine": {}} for n in ("fixed", "tail_read")]
            for given in (
                {"trigger": "ci", "triggered_by_token_id": ids["ci"], "labels": {"vllm_version": "1"}},
                {"trigger": "ci", "triggered_by_token_id": ids["ci"], "overrides": {"limit": 1}},
                {"trigger": "ci", "triggered_by_token_id": ids["ci"], "labels": {"mutation_batch": "fake"}},
                {"trigger": "manual", "triggered_by_token_id": ids["admin"], "labels": {"mutation_batch": "b1"}},
                {"trigger": "schedule", "triggered_by": "scheduler"},
                {"trigger": "manual", "triggered_by": "alice", "labels": {"mutation_batch": "b2"}, "arms": arms},
            ):
                connection.execute(sa.insert(runs).values(_filled(runs, profile="p", status="passed", **given)))
        upgrade(empty_database)
        with engine.connect() as connection:
            runs, batches = (Table(name, MetaData(), autoload_with=connection) for name in ("runs", "mutation_batches"))
            stored = connection.execute(sa.select(runs.c.triggered_role, runs.c.exploratory).order_by(runs.c.id)).all()
            records = connection.execute(
                sa.select(batches.c.batch, batches.c.started_role, batches.c.mutants).order_by(batches.c.id)
            ).all()
        assert [role for role, _ in stored] == ["ci", "ci", "ci", "admin", "scheduler", "host"]
        assert [bool(why) for _, why in stored] == [False, True, True, True, False, True]
        assert "limit" in stored[1][1]
        assert [(b, r, list(m)) for b, r, m in records] == [("b1", "admin", []), ("b2", "host", ["tail_read"])]
    finally:
        engine.dispose()
