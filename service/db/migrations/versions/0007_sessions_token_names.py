"""dashboard sessions, unique token names, and the token that triggered each run

The dashboard's login cookie becomes a random session id, stored only as its SHA-256 hash
with an expiry, ended by logout and by revoking its token. Token names become unique: where
earlier databases hold a name twice, the older token keeps it and each later one is renamed
`<name>-<id>`. A run records the id of the token that triggered it, so a ci token may cancel
its own runs only; runs queued before this revision get it where their `triggered_by` names
exactly one token. A finished run keeps its wall time as a number (`duration_s`, filled in
here for runs that ended before), and an index on (profile, duration_s) covers `/metrics`'
duration histogram, so a scrape reads that index instead of every run row.

Revision ID: 0007_sessions_token_names
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_sessions_token_names"
down_revision = "0006_run_arms"
branch_labels = None
depends_on = None

tokens = sa.table("api_tokens", sa.column("id", sa.Integer), sa.column("name", sa.String))
runs = sa.table(
    "runs",
    sa.column("id", sa.Integer),
    sa.column("triggered_by", sa.String),
    sa.column("triggered_by_token_id", sa.Integer),
)


def _backfill_durations(connection: sa.Connection) -> None:
    if connection.dialect.name == "postgresql":
        seconds = "EXTRACT(EPOCH FROM finished_at - started_at)"
    else:
        seconds = "(julianday(finished_at) - julianday(started_at)) * 86400.0"
    connection.execute(
        sa.text(f"UPDATE runs SET duration_s = {seconds} WHERE finished_at IS NOT NULL AND started_at IS NOT NULL")
    )


def _backfill_run_tokens(connection: sa.Connection) -> None:
    single = (
        sa.select(tokens.c.name, sa.func.min(tokens.c.id).label("id"))
        .group_by(tokens.c.name)
        .having(sa.func.count() == 1)
    )
    for name, token_id in connection.execute(single).all():
        connection.execute(runs.update().where(runs.c.triggered_by == name).values(triggered_by_token_id=token_id))


def _rename_duplicate_names(connection: sa.Connection) -> None:
    rows = connection.execute(sa.select(tokens.c.id, tokens.c.name).order_by(tokens.c.id)).all()
    seen = {name for _, name in rows}
    kept: set[str] = set()
    for token_id, name in rows:
        if name not in kept:
            kept.add(name)
            continue
        new = f"{name[:100]}-{token_id}"
        while new in seen:
            new += "-"
        seen.add(new)
        connection.execute(tokens.update().where(tokens.c.id == token_id).values(name=new))


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("triggered_by_token_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            "fk_runs_triggered_by_token_id", "api_tokens", ["triggered_by_token_id"], ["id"], ondelete="SET NULL"
        )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("duration_s", sa.Float(), nullable=True))
    connection = op.get_bind()
    _backfill_durations(connection)
    _backfill_run_tokens(connection)
    _rename_duplicate_names(connection)
    with op.batch_alter_table("api_tokens") as batch:
        batch.create_unique_constraint("uq_api_tokens_name", ["name"])
    op.create_table(
        "dashboard_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("secret_hash"),
    )
    op.create_index("ix_dashboard_sessions_token_id", "dashboard_sessions", ["token_id"])
    op.create_index("ix_runs_durations", "runs", ["profile", "duration_s"])


def downgrade() -> None:
    op.drop_index("ix_runs_durations", table_name="runs")
    op.drop_index("ix_dashboard_sessions_token_id", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_constraint("uq_api_tokens_name", type_="unique")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("fk_runs_triggered_by_token_id", type_="foreignkey")
        batch.drop_column("triggered_by_token_id")
        batch.drop_column("duration_s")
