"""quotas and coalesced fires: admin-set queue limits; one fire row for a run of identical skips

`quotas` holds the queue limits an admin changed through the API (service.runs.quotas); a
limit without a row has its setting's value. A schedule fire that is skipped for the same
reason as the fire before it is folded into that row (`skipped_fires` counts them from
`first_fire_time` on), so an every-second schedule blocked by its unfinished run writes no row
per second. `ix_runs_fair_order` serves the claim's look-up of when each caller last had a
run started.

Revision ID: 0012_quotas_and_coalesced_fires
Revises: 0011_gate_grade_batches
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_quotas_and_coalesced_fires"
down_revision = "0011_gate_grade_batches"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quotas",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("changed_by", sa.String(128), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.add_column("schedule_fires", sa.Column("skipped_fires", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("schedule_fires", sa.Column("first_fire_time", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_runs_fair_order", "runs", ["triggered_by", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_fair_order", table_name="runs")
    with op.batch_alter_table("schedule_fires") as batch:
        batch.drop_column("first_fire_time")
        batch.drop_column("skipped_fires")
    op.drop_table("quotas")
