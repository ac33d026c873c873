"""Stamp a migrated database with a revision no migration of this install names, as a newer
nightdesk leaves it, and read back everything it stores: the commands run on it must leave
it as it was (tests/unit/db/test_engine_newer_schema.py,
tests/integration/test_schema_newer_postgres.py).
"""

from __future__ import annotations

from sqlalchemy import inspect, text

from app.db.engine import get_engine, head_revision

FUTURE = "9999_future"
# Every entry point: read commands, the schema's own command, a night, its resume, a rerun,
# the web server and the scheduler daemon.
COMMANDS = [("ranking",), ("batches",), ("report",), ("db", "upgrade"), ("run",),
            ("run", "--resume"), ("rerun", "AAPL"), ("web", "--local-only"), ("scheduler",)]


def stamp_future(url: str) -> None:
    with get_engine(url).begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": FUTURE})


def contents(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Return every table's rows, in a stable order."""
    engine = get_engine(url)
    with engine.connect() as conn:
        return {table: sorted(map(tuple, conn.execute(text(f'SELECT * FROM "{table}"'))),
                              key=repr)
                for table in inspect(conn).get_table_names()}


def refused_in_one_line(code: int, stderr: str) -> str:
    """Assert the refusal: exit 2 (a database that cannot be used) and one error line naming
    the revision and this install's newest; return the line."""
    lines = [line for line in stderr.splitlines() if line.strip() and
             not line.startswith("note: ")]
    assert code == 2, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: the database "), lines
    assert said_truthfully(lines[0]), lines
    return lines[0]


def said_truthfully(line: str) -> bool:
    """Return whether ``line`` names the revision as one this install does not know, its
    newest, the two programs that may have written it and what to do; a revision it does not
    know is not said to be newer (another program may have written it)."""
    return (f"schema revision {FUTURE}, one this nightdesk does not know (its newest is "
            f"{head_revision()}): a newer nightdesk migrated it, or another program wrote "
            "it; upgrade nightdesk" in line and "newer than" not in line)
