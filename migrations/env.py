"""Run Alembic migrations on the connection nightdesk hands over, or on the configured URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from app.db.engine import migration_engine
from app.db.models import Base

config = context.config
target_metadata = Base.metadata


# Tables that live in our database but are not ours to migrate: the scheduler daemon's job
# store (APScheduler creates and owns it) and, on PostgreSQL, the LangGraph checkpoint
# saver's (app/runs/checkpoints.py). Autogenerate must not offer to drop them.
FOREIGN_TABLES = {"apscheduler_jobs", "checkpoints", "checkpoint_blobs", "checkpoint_writes",
                  "checkpoint_migrations"}


def _include_object(obj: object, name: str | None, type_: str, reflected: bool,
                    compare_to: object) -> bool:
    return not (type_ == "table" and name in FOREIGN_TABLES)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_object=_include_object,
        # SQLite cannot ALTER most things; batch mode keeps one chain for both backends.
        render_as_batch=connection.dialect.name == "sqlite",
        # One transaction per migration, its version stamp inside it, on SQLite too (the
        # engine from app.db.engine.migration_engine makes its DDL transactional): a kill at
        # any statement leaves the last finished migration, and the next upgrade goes on.
        transactional_ddl=True,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from app.config import get_settings

        url = get_settings().store.database_url
    engine = migration_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


run_migrations_online()
