"""sample data: per-sample fields a metric kind keeps beyond the fixed columns (drift: both arms' tokens and logprobs)

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("data", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("severity", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("severity")
        batch.drop_column("data")
