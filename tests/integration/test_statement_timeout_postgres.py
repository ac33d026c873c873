"""Every PostgreSQL statement is bounded: NIGHTDESK_DB_STATEMENT_TIMEOUT_S (default 60 s)
sets each connection's statement_timeout, and a statement the server cancels at it is one
line on stderr, exit 2. Before, no statement had a bound: a lock held by another session
hung a command for ever. Driven on the real PostgreSQL at 127.0.0.1:5432 (pg_sleep)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from app.db.engine import get_engine, timed_out
from tests.integration.conftest import private_database
from tests.unit.support.clirun import run_cli

pytestmark = pytest.mark.integration
_numbers = itertools.count()


@pytest.fixture
def pg_url() -> Iterator[str]:
    with private_database(f"nightdesk_timeout_{os.getpid()}_{next(_numbers)}",
                          upgraded=True) as url:
        yield url


def _timeout(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SHOW statement_timeout")).scalar_one())


def test_a_statement_past_the_timeout_is_cancelled_in_one_line(pg_url: str) -> None:
    assert _timeout(get_engine(pg_url)) == "1min"  # the default: 60 s
    short = get_engine(pg_url, 0.5)
    assert _timeout(short) == "500ms"
    with short.connect() as conn, pytest.raises(OperationalError) as caught:
        conn.execute(text("SELECT pg_sleep(3)"))
    said = timed_out(caught.value)
    assert said is not None and "NIGHTDESK_DB_STATEMENT_TIMEOUT_S" in said
    with short.connect() as conn:  # within the bound, the same engine answers
        assert conn.execute(text("SELECT 1 FROM pg_sleep(0.1)")).scalar_one() == 1


def test_a_command_held_up_by_a_lock_ends_in_one_line(pg_url: str) -> None:
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(plain) as holder:  # another session holds the table
        holder.execute("LOCK TABLE batches IN ACCESS EXCLUSIVE MODE")
        result = run_cli("batches", env={"NIGHTDESK_DATABASE_URL": pg_url,
                                         "NIGHTDESK_DB_STATEMENT_TIMEOUT_S": "1"})
        holder.rollback()
    assert result.code == 2, result.stderr
    assert result.stderr.splitlines() == [
        "error: the database did not answer a statement within "
        "NIGHTDESK_DB_STATEMENT_TIMEOUT_S: the server cancelled it (a lock held too long, or "
        "the server overloaded)"], result.stderr
