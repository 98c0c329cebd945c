"""Alembic environment: online migrations only, against the URL the caller configured."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from service.db.models import Base

url = context.config.get_main_option("sqlalchemy.url")
assert url, "sqlalchemy.url must be set by service.db.migrate"
connectable = create_engine(url, poolclass=pool.NullPool)
with connectable.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
