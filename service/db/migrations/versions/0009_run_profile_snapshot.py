"""run profile snapshot: a run keeps the profile as resolved when it was triggered

`runs.profile_snapshot` holds the validated profile with the run's overrides in place, so an
edit of the profile's YAML between trigger and execution does not change a queued run. Rows
queued before this migration keep NULL and execute their profile by name, as before.

Revision ID: 0009_run_profile_snapshot
Revises: 0008_audit_events
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_run_profile_snapshot"
down_revision = "0008_audit_events"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("profile_snapshot", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("profile_snapshot")
