"""gate grade and batch records: which runs may decide a release, and mutation batches as records

`runs.triggered_role` is the role that triggered a run (a token's role, `scheduler`, or `host`
for the CLI on the service's own host) and `runs.exploratory` why the run did not run its profile
as defined ("" when it did): only a run with neither problem decides a release.
`mutation_batches` holds each batch `kvcanary mutants` started (who, when, which mutants, its
run) and the matrix computed once when that run ended, so no label a caller sets can choose the
mutation score a page shows. `release_comparisons` keeps a release page's paired comparison of a
profile's run against its run in the previous release, computed when the later run ended.

Existing rows: the role comes from the token that queued the run (`scheduler` for schedule fires,
`host` without a token); a run with a `mutation_batch` label, or with a `limit`, `suites`,
`kernel_variant` or `canaries` override, is exploratory. A labelled run queued by an admin or on
the host becomes a batch record (`kvcanary doctor --settle` computes its matrix); one queued by a ci
token is not a batch.

Revision ID: 0011_gate_grade_batches
Revises: 0010_wer_into_data
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0011_gate_grade_batches"
down_revision = "0010_wer_into_data"
branch_labels = None
depends_on = None

BATCH_LABEL = "mutation_batch"
REDUCING = ("limit", "suites", "kernel_variant", "canaries")


def _exploratory(labels: dict[str, Any], overrides: dict[str, Any]) -> str:
    if BATCH_LABEL in labels:
        return "a mutation batch (arms fixed and mutants)"
    changed = [key for key in REDUCING if overrides.get(key) is not None]
    return f"overrides {', '.join(changed)} (recorded before gate grade was)" if changed else ""


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("triggered_role", sa.String(16), nullable=False, server_default=""))
        batch.add_column(sa.Column("exploratory", sa.Text(), nullable=False, server_default=""))
    op.create_table(
        "mutation_batches",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("batch", sa.String(64), nullable=False),
        sa.Column("profile", sa.String(64), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("started_by", sa.String(128), nullable=False),
        sa.Column("started_role", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("mutants", sa.JSON(), nullable=False),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("matrix", sa.JSON(), nullable=True),
        sa.UniqueConstraint("batch", "profile", name="uq_mutation_batches_batch_profile"),
    )
    op.create_index("ix_mutation_batches_profile", "mutation_batches", ["profile", "id"])
    op.create_table(
        "release_comparisons",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("previous_run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("previous_run_id", "run_id", name="uq_release_comparisons_pair"),
    )
    op.create_index("ix_release_comparisons_run_id", "release_comparisons", ["run_id"])
    bind = op.get_bind()
    runs = sa.table(
        "runs",
        sa.column("id", sa.Integer), sa.column("profile", sa.String), sa.column("trigger", sa.String),
        sa.column("triggered_by", sa.String), sa.column("triggered_by_token_id", sa.Integer),
        sa.column("labels", sa.JSON), sa.column("overrides", sa.JSON), sa.column("arms", sa.JSON),
        sa.column("created_at", sa.DateTime(timezone=True)), sa.column("triggered_role", sa.String),
        sa.column("exploratory", sa.Text),
    )  # fmt: skip
    tokens = sa.table("api_tokens", sa.column("id", sa.Integer), sa.column("role", sa.String))
    batches = sa.table(
        "mutation_batches",
        sa.column("batch", sa.String), sa.column("profile", sa.String), sa.column("run_id", sa.Integer),
        sa.column("started_by", sa.String), sa.column("started_role", sa.String),
        sa.column("started_at", sa.DateTime(timezone=True)), sa.column("mutants", sa.JSON),
    )  # fmt: skip
    roles = dict(bind.execute(sa.select(tokens.c.id, tokens.c.role)).all())
    rows = bind.execute(
        sa.select(
            runs.c.id, runs.c.profile, runs.c.trigger, runs.c.triggered_by, runs.c.triggered_by_token_id,
            runs.c.labels, runs.c.overrides, runs.c.arms, runs.c.created_at,
        ).order_by(runs.c.id)
    ).all()  # fmt: skip
    seen: set[tuple[str, str]] = set()
    for run_id, profile, trigger, by, token_id, labels, overrides, arms, created_at in rows:
        labels, overrides = labels or {}, overrides or {}
        role = roles.get(token_id, "") if token_id is not None else "scheduler" if trigger == "schedule" else "host"
        bind.execute(
            sa.update(runs)
            .where(runs.c.id == run_id)
            .values(triggered_role=role, exploratory=_exploratory(labels, overrides))
        )
        batch_id = str(labels.get(BATCH_LABEL) or "")[:64]
        if batch_id and role in ("admin", "host") and (batch_id, profile) not in seen:
            seen.add((batch_id, profile))
            mutants = [arm["variant"] for arm in arms or [] if arm.get("variant") != "fixed"]
            bind.execute(
                sa.insert(batches).values(
                    batch=batch_id, profile=profile, run_id=run_id, started_by=by or role,
                    started_role=role, started_at=created_at, mutants=mutants,
                )
            )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_release_comparisons_run_id", table_name="release_comparisons")
    op.drop_table("release_comparisons")
    op.drop_index("ix_mutation_batches_profile", table_name="mutation_batches")
    op.drop_table("mutation_batches")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("exploratory")
        batch.drop_column("triggered_role")
