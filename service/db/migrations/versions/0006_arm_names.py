"""arm names: 32 characters, so that every kernel variant of kernels.mutants fits (softmax_scale_drift is 19)

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TABLES = ("suite_results", "samples")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.alter_column("arm", existing_type=sa.String(length=16), type_=sa.String(length=32))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.alter_column("arm", existing_type=sa.String(length=32), type_=sa.String(length=16))
