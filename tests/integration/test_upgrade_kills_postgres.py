"""``nightdesk db upgrade`` killed after any statement of any migration runs again on
PostgreSQL: the SQLite test's kills (tests/unit/support/upgrade_kills.py) on private databases,
each a copy (``CREATE DATABASE … TEMPLATE``) of its starting one, all dropped after."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest
from alembic import command
from psycopg import sql

from app.db.engine import alembic_config, get_engine, upgrade
from tests.integration.conftest import ADMIN_DSN
from tests.unit.support.upgrade_kills import check_every_kill, discover, populate, snapshot

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BASE = ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)


class Databases:
    """Make private databases named ``nd_kill_<pid>_<name>``; drop every one at the end."""

    def __init__(self) -> None:
        self.prefix = f"nd_kill_{os.getpid()}_"
        self.made: list[str] = []

    def make(self, name: str, template: str | None = None) -> str:
        full = self.prefix + name
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(full))
        if template is not None:
            get_engine(self.url(template)).dispose()  # a template must have no session
            create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(self.prefix + template))
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(create)
        self.made.append(full)
        return self.url(name)

    def url(self, name: str) -> str:
        return f"{BASE}/{self.prefix}{name}"

    def drop_all(self) -> None:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            for full in self.made:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                              .format(sql.Identifier(full)))


@pytest.fixture
def databases() -> Iterator[Databases]:
    made = Databases()
    try:
        yield made
    finally:
        get_engine.cache_clear()
        made.drop_all()


def test_an_upgrade_killed_after_any_statement_on_postgres_runs_again(
        databases: Databases) -> None:
    steps = discover(databases.make("discover"))
    assert all(step.statements for step in steps), "a migration that sent nothing"
    upgrade(clean := databases.make("clean"))
    expected = snapshot(clean)
    points = sum(len(step.statements) for step in steps)
    assert check_every_kill(databases.make, points, expected, "blank") == points


def test_an_upgrade_killed_after_any_statement_on_a_populated_postgres_runs_again(
        databases: Databases) -> None:
    steps = discover(databases.make("discover"))
    for step in steps[1:]:
        base = databases.make(step.revision.lower())
        command.upgrade(alembic_config(base), step.down or "base")
        assert populate(base) > 0
        upgrade(clean := databases.make(f"{step.revision.lower()}_clean",
                                        template=step.revision.lower()))
        expected = snapshot(clean)
        assert any(table["rows"] for table in expected.values())

        def copy(name: str, template: str = step.revision.lower()) -> str:
            return databases.make(name.lower(), template=template)

        check_every_kill(copy, len(step.statements), expected, step.revision)
