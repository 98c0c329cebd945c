"""run arms: each arm a kernel variant plus engine overrides, keyed by its name; expectations and outcome

`runs.variants` (a list of variant names) becomes `runs.arms` (a list of {name, variant,
engine}); an existing row's variants become plain arms, whose names are the variants, so its
samples and results keep their keys. Arm names such as `fixed,max_num_batched_tokens=64` are
longer than a variant, so the arm columns and the progress phase (`arm/suite`) widen.
`expect` (arm name -> pass|fail), `arm_verdicts` and `outcome` (as_expected | unexpected)
hold a run's expectations and how its arms met them.

Revision ID: 0006_run_arms
Revises: 0005
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0006_run_arms"
down_revision = "0005"
branch_labels = None
depends_on = None

ARM_LENGTH = 200
runs = sa.table("runs", sa.column("id", sa.Integer()), sa.column("variants", sa.JSON()), sa.column("arms", sa.JSON()))


def _as_list(value: Any) -> list[Any]:
    return json.loads(value) if isinstance(value, str) else list(value or [])


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("arms", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("expect", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("arm_verdicts", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("outcome", sa.String(length=16), nullable=True))
        batch.alter_column("progress_phase", type_=sa.String(length=255), existing_type=sa.String(length=64))
    bind = op.get_bind()
    for run_id, variants in bind.execute(sa.select(runs.c.id, runs.c.variants)).all():
        arms = [{"name": v, "variant": v, "engine": {}} for v in _as_list(variants)]
        if arms:
            bind.execute(runs.update().where(runs.c.id == run_id).values(arms=arms))
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("variants")
    for table in ("samples", "suite_results"):
        with op.batch_alter_table(table) as batch:
            batch.alter_column("arm", type_=sa.String(length=ARM_LENGTH), existing_type=sa.String(length=16))


def downgrade() -> None:
    for table in ("samples", "suite_results"):
        with op.batch_alter_table(table) as batch:
            batch.alter_column("arm", type_=sa.String(length=16), existing_type=sa.String(length=ARM_LENGTH))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("variants", sa.JSON(), nullable=False, server_default="[]"))
    bind = op.get_bind()
    for run_id, arms in bind.execute(sa.select(runs.c.id, runs.c.arms)).all():
        names = [arm["name"] for arm in _as_list(arms)]
        if names:
            bind.execute(runs.update().where(runs.c.id == run_id).values(variants=names))
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("outcome")
        batch.drop_column("arm_verdicts")
        batch.drop_column("expect")
        batch.drop_column("arms")
        batch.alter_column("progress_phase", type_=sa.String(length=64), existing_type=sa.String(length=255))
