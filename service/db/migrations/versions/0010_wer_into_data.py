"""wer into data: a sample's word counts move from five fixed columns into data["wer"]

The WER kind (`evals.kinds.wer`) owns its per-sample data like every other kind: the counts
live in `samples.data["wer"]` (substitutions, deletions, insertions, ref_words), and the
sample's severity is its word errors, which orders the worst utterances first as the dropped
`word_errors` column did. Downgrade puts the columns back from data and clears what upgrade set.

Revision ID: 0010_wer_into_data
Revises: 0009_run_profile_snapshot
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0010_wer_into_data"
down_revision = "0009_run_profile_snapshot"
branch_labels = None
depends_on = None

COUNTS = ("substitutions", "deletions", "insertions", "ref_words")
KEY = "wer"


def _samples(*columns: str) -> sa.TableClause:
    return sa.table(
        "samples", sa.column("id", sa.Integer), sa.column("data", sa.JSON), sa.column("severity", sa.Float),
        *(sa.column(name, sa.Integer) for name in columns),
    )  # fmt: skip


def upgrade() -> None:
    bind = op.get_bind()
    table = _samples(*COUNTS)
    rows = bind.execute(
        sa.select(table.c.id, table.c.data, *(table.c[name] for name in COUNTS)).where(
            sa.and_(*(table.c[name].is_not(None) for name in COUNTS))
        )
    ).all()
    for row in rows:
        counts = {name: int(getattr(row, name)) for name in COUNTS}
        data: dict[str, Any] = {**(row.data or {}), KEY: counts}
        errors = counts["substitutions"] + counts["deletions"] + counts["insertions"]
        bind.execute(table.update().where(table.c.id == row.id).values(data=data, severity=float(errors)))
    with op.batch_alter_table("samples") as batch:
        for name in (*COUNTS, "word_errors"):
            batch.drop_column(name)


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        for name in (*COUNTS, "word_errors"):
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))
    bind = op.get_bind()
    table = _samples(*COUNTS, "word_errors")
    for row in bind.execute(sa.select(table.c.id, table.c.data)).all():
        counts = (row.data or {}).get(KEY)
        if not isinstance(counts, dict):
            continue
        data = {k: v for k, v in row.data.items() if k != KEY}
        errors = counts["substitutions"] + counts["deletions"] + counts["insertions"]
        values = {name: counts[name] for name in COUNTS}
        bind.execute(
            table.update().where(table.c.id == row.id).values(data=data, severity=None, word_errors=errors, **values)
        )
