"""Kill ``db upgrade`` after each statement that changes the database, then run it again.

The statements are found by running every migration of the chain one at a time and
recording what each sends (DDL and data: CREATE, ALTER, DROP, INSERT, UPDATE, DELETE), so a
migration added later is covered without editing the tests. A kill is a real SIGKILL of a
forked child, sent by itself right after the n-th such statement came back from the
database. The expected state is not written down: it is what a clean upgrade of the same
starting database gives, compared table by table (columns, keys, indexes, every row).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.pool import NullPool

from app.db.engine import alembic_config, current_revision, get_engine, head_revision, upgrade
from tests.unit.support.clirun import run_cli

CHANGES = ("CREATE", "ALTER", "DROP", "INSERT", "UPDATE", "DELETE")
ROWS = 3  # rows per table in a populated database


def changes_database(statement: str) -> bool:
    words = statement.split(None, 1)
    return bool(words) and words[0].upper() in CHANGES


@contextmanager
def statements_sent() -> Iterator[list[str]]:
    """Collect every statement that changes the database, from any engine, while open."""
    seen: list[str] = []

    def _record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if changes_database(statement):
            seen.append(statement.strip().splitlines()[0])

    event.listen(Engine, "after_cursor_execute", _record)
    try:
        yield seen
    finally:
        event.remove(Engine, "after_cursor_execute", _record)


def chain() -> list[str]:
    """Return every revision, oldest first."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


@dataclass(frozen=True)
class Step:
    revision: str
    down: str | None
    statements: list[str]


def discover(url: str) -> list[Step]:
    """Upgrade the blank database at ``url`` one revision at a time; return what each sent."""
    cfg = alembic_config(url)
    steps: list[Step] = []
    down: str | None = None
    for revision in chain():
        with statements_sent() as seen:
            command.upgrade(cfg, revision)
        steps.append(Step(revision, down, list(seen)))
        down = revision
    return steps


def forget_engine(url: str) -> None:
    """Close the pooled connections nightdesk's shared engine for ``url`` holds."""
    get_engine(url).dispose()


def revision_of(url: str) -> str | None:
    engine = create_engine(url, poolclass=NullPool)
    try:
        return current_revision(engine)
    finally:
        engine.dispose()


def upgrade_killed_after(url: str, n: int) -> None:
    """Run ``upgrade(url)`` in a child that SIGKILLs itself right after its n-th change.

    The child inherits the parent's open connections but never uses them: it makes its own.
    """
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            count = 0

            def _kill(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
                nonlocal count
                if changes_database(statement):
                    count += 1
                    if count == n:
                        os.kill(os.getpid(), signal.SIGKILL)

            event.listen(Engine, "after_cursor_execute", _kill)
            upgrade(url)
        finally:
            os._exit(3)  # the upgrade ended before its n-th statement
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the upgrade was to be killed after statement {n} but exited with status {status}")


def upgrade_again(url: str) -> None:
    """Run ``nightdesk db upgrade`` on ``url`` as an operator would; it must succeed."""
    result = run_cli("db", "upgrade", env={"NIGHTDESK_DATABASE_URL": url})
    assert result.code == 0, result.stderr
    assert f"to {head_revision()}" in result.stdout or \
        f"at revision {head_revision()}" in result.stdout, result.stdout


def snapshot(url: str) -> dict[str, Any]:
    """Return the schema and every row of every table, in a form that compares equal."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        found: dict[str, Any] = {}
        inspector = inspect(engine)
        # One catalog query per kind for all tables (PostgreSQL's per-table reflection is slow).
        columns = inspector.get_multi_columns()
        uniques = inspector.get_multi_unique_constraints()
        indexes = inspector.get_multi_indexes()
        foreign = inspector.get_multi_foreign_keys()
        with engine.connect() as conn:
            for key in sorted(columns, key=lambda k: k[1]):
                table = key[1]
                found[table] = {
                    "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in columns[key]],
                    "unique": sorted((u["name"], tuple(u["column_names"])) for u in uniques[key]),
                    "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                                      for i in indexes[key]),
                    "foreign keys": sorted((tuple(f["constrained_columns"]), f["referred_table"])
                                           for f in foreign[key]),
                    "rows": sorted(repr(tuple(row))
                                   for row in conn.execute(text(f'SELECT * FROM "{table}"'))),
                }
        return found
    finally:
        engine.dispose()


def _value(column: sa.Column[Any], i: int) -> Any:
    """Return row ``i``'s value for ``column``: distinct per row, valid for its type."""
    kind = column.type
    for fk in column.foreign_keys:
        # Rows 1..ROWS of every table exist before the tables that point at them.
        return None if fk.column.table is column.table and column.nullable else i
    if isinstance(kind, sa.Boolean):
        return i % 2 == 0
    if isinstance(kind, sa.Integer):
        return i
    if isinstance(kind, sa.Float | sa.Numeric):
        return i + 0.25
    if isinstance(kind, sa.DateTime):
        return datetime(2026, 1, i, 3, tzinfo=UTC)
    if isinstance(kind, sa.Date):
        return date(2026, 1, i)
    if isinstance(kind, sa.JSON):
        return {"row": i, "column": column.name}
    if isinstance(kind, sa.LargeBinary):
        return f"{column.name} {i}".encode()
    if isinstance(kind, sa.String):
        return f"{i}{column.name}"[:kind.length or None]
    raise AssertionError(f"no test value for {column.table.name}.{column.name} ({kind}): "
                         "teach tests/unit/support/upgrade_kills.py this type")


def populate(url: str) -> int:
    """Put ROWS rows into every table the database has now (found, not listed); return rows."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        stored = 0
        with engine.begin() as conn:
            for table in meta.sorted_tables:
                if table.name == "alembic_version":
                    continue
                columns = [c for c in table.columns
                           if not (c.primary_key and isinstance(c.type, sa.Integer))]
                conn.execute(table.insert(), [{c.name: _value(c, i) for c in columns}
                                              for i in range(1, ROWS + 1)])
                stored += ROWS
        return stored
    finally:
        engine.dispose()


def check_every_kill(start: Callable[[str], str], points: int, clean: dict[str, Any],
                     label: str) -> int:
    """Kill an upgrade of a fresh copy of the start after each of ``points`` statements.

    ``start(name)`` makes a new copy of the starting database and returns its URL. After
    each kill the database is not current, ``nightdesk db upgrade`` then succeeds and the
    database equals ``clean`` (a clean upgrade's snapshot). Returns the kills made.
    """
    for n in range(1, points + 1):
        url = start(f"{label}_{n}")
        upgrade_killed_after(url, n)
        assert revision_of(url) != head_revision(), (
            f"{label}: killed after statement {n}, yet the database is current")
        upgrade_again(url)
        forget_engine(url)
        after = snapshot(url)
        assert after == clean, f"{label}: killed after statement {n}, then upgraded: " + str(
            {table: after.get(table) for table in set(after) | set(clean)
             if after.get(table) != clean.get(table)})
    return points
