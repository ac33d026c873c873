"""A schema upgrade behind another session's lock on PostgreSQL ends in one line within
NIGHTDESK_DB_STATEMENT_TIMEOUT_S (each lock wait's bound, ``lock_timeout``), naming the
setting and the session holding it, exit 2, the schema left at the last migration that
finished; run again once the lock is let go, it finishes. Before, it waited for ever.
Driven on the real PostgreSQL at 127.0.0.1:5432: a read transaction left open on a table
the next migration alters (what a forgotten `psql` session or a long report does)."""

from __future__ import annotations

import itertools
import os
import time

import pytest
from alembic import command
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from app.db.engine import (
    alembic_config,
    current_revision,
    get_engine,
    head_revision,
    migration_engine,
)
from tests.dbfaults import Held
from tests.integration.conftest import private_database
from tests.unit.support.clirun import run_cli

pytestmark = pytest.mark.integration
_numbers = itertools.count()

BEFORE = "0014_served_by"  # the next migration, 0015_sample_chain_slots, alters server_samples


class ReadHeld(Held):
    """Another session in an open transaction that has read ``table`` (its ACCESS SHARE lock,
    which every ALTER waits for), until ``release`` or ``seconds`` later."""

    def __init__(self, dsn: str, table: str, seconds: float) -> None:
        super().__init__(dsn, f"SELECT count(*) FROM {table}", (), seconds)


def _columns(url: str, table: str) -> set[str]:
    with get_engine(url).connect() as conn:
        return {c["name"] for c in inspect(conn).get_columns(table)}


def test_an_upgrade_behind_a_lock_fails_in_one_line_and_finishes_once_it_is_let_go() -> None:
    with private_database(f"nightdesk_upgrade_lock_{os.getpid()}_{next(_numbers)}") as url:
        command.upgrade(alembic_config(url), BEFORE)
        env = {"NIGHTDESK_DATABASE_URL": url, "NIGHTDESK_DB_STATEMENT_TIMEOUT_S": "1"}
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        held = ReadHeld(dsn, "server_samples", 30.0)  # let go at 30 s: without a bound, no hang
        try:
            started = time.monotonic()
            result = run_cli("db", "upgrade", env=env)
            took = time.monotonic() - started
        finally:
            held.release()
        assert result.code == 2 and took < 15, (result, took)  # not until the lock went
        [line] = result.stderr.splitlines()
        assert line.startswith(
            "error: migration 0015_sample_chain_slots waited more than "
            f"NIGHTDESK_DB_STATEMENT_TIMEOUT_S (1 s) for a lock held by session {held.pid} "
            "(postgres, idle in transaction since "), line
        assert line.endswith(
            f") on server_samples: nothing of it applied, the schema stays at {BEFORE}; run "
            "`nightdesk db upgrade` again once that lock is let go"), line
        # The failed migration rolled back whole: the revision and the table as before it.
        assert current_revision(get_engine(url)) == BEFORE
        assert "chain_slots" not in _columns(url, "server_samples")

        again = run_cli("db", "upgrade", env=env)
        assert again.code == 0, again.stderr
        assert current_revision(get_engine(url)) == head_revision()
        assert "chain_slots" in _columns(url, "server_samples")


def test_a_migration_waits_on_locks_within_the_bound_but_its_work_has_none() -> None:
    # The bound is on waiting for another session's lock, not on the work: a data migration
    # on a large table may run longer than NIGHTDESK_DB_STATEMENT_TIMEOUT_S and must finish.
    with private_database(f"nightdesk_upgrade_lock_{os.getpid()}_{next(_numbers)}") as url:
        engine = migration_engine(url, 0.5)
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "500ms"
                assert conn.execute(text("SELECT 1 FROM pg_sleep(1.5)")).scalar_one() == 1
        finally:
            engine.dispose()
