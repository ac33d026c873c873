"""A PostgreSQL URL that names its schema (``?options=-csearch_path%3D<schema>``) is kept to it.

nightdesk's own libpq ``options`` (the statement and lock timeouts) once replaced the URL's,
so the search_path was dropped on every connection: `nightdesk db upgrade` created the
tables in ``public`` (or read another install's there as "already current"), and every row
of the night went there too. Now the schema, the night's rows, its lock's connection and
its checkpoints stay in the schema named; a schema that does not exist is one line, exit 2.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from tests.integration.conftest import private_database
from tests.unit.support.clirun import run_cli
from tests.unit.support.engines import fake_llm

pytestmark = pytest.mark.integration


def tables(url: str) -> dict[str, set[str]]:
    """Return the tables of each schema but the server's own, and each one's rows."""
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        rows = conn.execute("SELECT table_schema, table_name FROM information_schema.tables "
                            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
                            ).fetchall()
    found: dict[str, set[str]] = {}
    for schema, name in rows:
        found.setdefault(schema, set()).add(name)
    return found


def test_a_url_naming_its_schema_keeps_the_schema_and_the_night_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with private_database(f"nightdesk_ha_path_{os.getpid()}") as base:
        with psycopg.connect(base.replace("+psycopg", ""), autocommit=True) as admin:
            admin.execute("CREATE SCHEMA nd_mine")
        url = f"{base}?options=-csearch_path%3Dnd_mine"
        env = {"NIGHTDESK_DATABASE_URL": url, "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false",
               "NIGHTDESK_DATA_DIR": str(tmp_path / "data")}
        created = run_cli("db", "upgrade", env=env)
        assert created.code == 0, created.stderr
        assert created.stdout.startswith("database schema created at revision"), created.stdout
        assert "public" not in tables(base), tables(base)  # before: every table was there
        again = run_cli("db", "upgrade", env=env)
        assert again.stdout.startswith("database schema already current"), again.stdout

        write_demo(tmp_path / "data", DEMO_AS_OF, 1)
        fake_llm(monkeypatch, None, demo_tickers(1))
        night = run_cli("run", "--tickers", demo_tickers(1)[0], "--as-of", str(DEMO_AS_OF),
                        "--no-preflight", env=env)
        assert night.code == 0, night.stderr
        found = tables(base)
        assert set(found) == {"nd_mine"}, found  # the checkpoints' tables too
        with psycopg.connect(url.replace("+psycopg", "")) as conn:
            assert conn.execute("SELECT status FROM batches").fetchall() == [("succeeded",)]

        # A schema that does not exist: one line naming what to do, nothing written.
        missing = run_cli("db", "upgrade", env={
            **env, "NIGHTDESK_DATABASE_URL": f"{base}?options=-csearch_path%3Dnd_none"})
        assert missing.code == 2
        [line] = missing.error_lines
        assert "has no schema its search_path names" in line, line
        assert set(tables(base)) == {"nd_mine"}


def test_two_schemas_of_one_database_take_their_own_nightly_and_scheduler_locks() -> None:
    # Advisory locks are per database: with one key for all, a night in one schema's install
    # refused the other's (`already running`), and its second daemon would not start.
    from app.db.engine import get_engine, upgrade
    from app.db.lock import NightlyLockView, nightly_lock, scheduler_lock
    from app.errors import AlreadyRunningError

    with private_database(f"nightdesk_ha_locks_{os.getpid()}") as base:
        with psycopg.connect(base.replace("+psycopg", ""), autocommit=True) as admin:
            admin.execute("CREATE SCHEMA nd_a")
            admin.execute("CREATE SCHEMA nd_b")
        a, b = (f"{base}?options=-csearch_path%3D{name}" for name in ("nd_a", "nd_b"))
        for url in (a, b, base):  # ``base``: public, the key of earlier releases
            upgrade(url)
        engines = [get_engine(url) for url in (a, b, base)]
        try:
            with nightly_lock(engines[0]) as first, scheduler_lock(engines[0]):
                assert first is not None
                assert NightlyLockView(engines[0]).free_since() is None  # held, and seen so
                assert NightlyLockView(engines[1]).free_since() is not None
                with pytest.raises(AlreadyRunningError), nightly_lock(engines[0]):
                    pass  # its own schema's second night is refused, as ever
                with nightly_lock(engines[1]) as second, scheduler_lock(engines[1]) as daemon:
                    assert second is not None and daemon is not None
                    with nightly_lock(engines[2]) as public:
                        assert public is not None
        finally:
            for engine in engines:
                engine.dispose()
