"""PostgreSQL's connections used up by others when a night starts (SQLSTATE 53300, "too many
connections"): waited for within the write budget, as the same refusal mid-night is; past
it, one line and exit 2. Before, the night's first connection was one try: refused at once.

The refusal is the server's own: a role of the test's own (a superuser is exempt) with
``CONNECTION LIMIT 0``, what a server whose ``max_connections`` others hold says too, lifted
from a thread a few seconds after the start.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog
from psycopg import sql
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

import app.cli.common
import app.db.retry
from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.config import load_settings
from app.db.engine import get_engine, upgrade
from app.db.models import Batch
from app.errors import DatabaseError
from app.runs.nightly import NightlyRequest, run_nightly
from tests.fakevllm import FakeServer
from tests.integration.conftest import ADMIN_DSN
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import (
    NODES,
    QUICK,
    QUICK_ENV,
    assert_rows_match_the_servers,
    serve_cli_from,
)

pytestmark = pytest.mark.integration

TICKERS = demo_tickers(2)
LIMITED = "too many connections for role"
WAITING = "database takes no connection now; waiting"


class Role:
    """A login role owning a database of its own (its schema migrated as that role)."""

    def __init__(self, prefix: str = "nd") -> None:
        tag = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self.name, self.database = f"{prefix}_limited_{tag}", f"{prefix}_nightdesk_{tag}"
        base = ADMIN_DSN.rsplit("@", 1)[1].rsplit("/", 1)[0]
        self.url = f"postgresql+psycopg://{self.name}@{base}/{self.database}"

    def admin(self, statement: str) -> None:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL(statement).format(role=sql.Identifier(self.name),
                                                    db=sql.Identifier(self.database)))

    def limit(self, connections: int) -> None:
        """Set the role's connection limit (0: every new connection refused, -1: none)."""
        self.admin(f"ALTER ROLE {{role}} CONNECTION LIMIT {connections:d}")

    def lift_after(self, seconds: float) -> threading.Thread:
        def lift() -> None:
            time.sleep(seconds)
            self.limit(-1)

        thread = threading.Thread(target=lift, daemon=True)
        thread.start()
        return thread

    def batches(self) -> int:
        with get_engine(self.url).connect() as conn:
            return int(conn.execute(select(func.count()).select_from(Batch)).scalar_one())


@pytest.fixture(params=["nd"])
def role(request: pytest.FixtureRequest) -> Iterator[Role]:
    made = Role(request.param)
    made.admin("CREATE ROLE {role} LOGIN")
    made.admin("CREATE DATABASE {db} OWNER {role}")
    try:
        upgrade(made.url)
        get_engine(made.url).dispose()
        yield made
    finally:
        get_engine(made.url).dispose()
        made.admin("DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        made.admin("DROP ROLE IF EXISTS {role}")


def warnings_of(logs: list[dict[str, object]]) -> list[str]:
    return [str(entry.get("error")) for entry in logs
            if entry.get("event") == WAITING]


def test_a_night_whose_database_has_no_connection_left_at_its_start_waits_for_one(
        role: Role, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakeServer(nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, server, demo_dir)
    role.limit(0)
    lifted = role.lift_after(3.0)
    night = run_cli("run", "--tickers", ",".join(TICKERS), "--as-of", str(DEMO_AS_OF),
                    "--no-preflight", env={**QUICK_ENV, "NIGHTDESK_DATABASE_URL": role.url,
                                           "NIGHTDESK_DB_WRITE_BUDGET_S": "60"})
    lifted.join(10)
    assert night.code == 0, night.stderr
    said = [line for line in night.stderr.splitlines() if WAITING in line]
    assert said and all(LIMITED in line for line in said), night.stderr  # the fault was met
    assert_rows_match_the_servers(get_engine(role.url), 1, [server])


def test_a_daemons_night_whose_database_has_no_connection_left_waits_for_one(
        role: Role, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The daemon hands its engine over (checked at its own start): the night's first
    # connection is then the lock's.
    server = FakeServer(nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, server, demo_dir)
    settings = load_settings(**QUICK, database_url=role.url, data_dir=demo_dir,
                             db_write_budget_s=60.0)
    engine = get_engine(role.url)
    role.limit(0)
    lifted = role.lift_after(3.0)
    with structlog.testing.capture_logs() as logs:
        night = run_nightly(settings, NightlyRequest(as_of=DEMO_AS_OF, tickers=",".join(
            TICKERS)), engine=engine, server="skip")
    lifted.join(10)
    assert night.outcome is not None and night.outcome.status == "succeeded", night.outcome
    assert warnings_of(logs)
    assert_rows_match_the_servers(engine, night.outcome.batch_id, [server])


def test_connections_used_up_past_the_budget_refuse_the_night_in_one_line(
        role: Role, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=TICKERS), demo_dir)
    role.limit(0)
    started = time.monotonic()
    night = run_cli("run", "--tickers", ",".join(TICKERS), "--as-of", str(DEMO_AS_OF),
                    "--no-preflight", env={**QUICK_ENV, "NIGHTDESK_DATABASE_URL": role.url,
                                           "NIGHTDESK_DB_WRITE_BUDGET_S": "1.5"})
    waited = time.monotonic() - started
    role.limit(-1)
    assert night.code == 2, night.stderr
    [line] = [line for line in night.error_lines if line.startswith("error:")]
    assert LIMITED in line and line.endswith(
        "(still so after 1.5 s: NIGHTDESK_DB_WRITE_BUDGET_S)"), line
    assert "Traceback" not in night.stderr
    assert waited >= 1.0
    assert role.batches() == 0  # refused before its batch row


def test_a_database_that_is_not_there_is_still_refused_at_once(
        role: Role, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A refusal of what was asked for is the address's, not a passing state: not waited for.
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=TICKERS), demo_dir)
    wrong = role.url.rsplit("/", 1)[0] + "/no_such_database"
    started = time.monotonic()
    night = run_cli("run", "--tickers", ",".join(TICKERS), "--no-preflight",
                    env={**QUICK_ENV, "NIGHTDESK_DATABASE_URL": wrong,
                         "NIGHTDESK_DB_WRITE_BUDGET_S": "60"})
    assert night.code == 2, night.stderr
    assert 'database "no_such_database" does not exist' in night.error_lines[-1]
    assert time.monotonic() - started < 30


def test_busy_is_the_servers_word_for_a_connection_it_will_take_later() -> None:
    from app.db.retry import busy

    assert busy(psycopg.OperationalError('connection to server at "h", port 5432 failed: '
                                         "FATAL:  sorry, too many clients already"))
    assert busy(psycopg.OperationalError("FATAL:  the database system is starting up"))
    assert not busy(psycopg.OperationalError('FATAL:  role "x" does not exist'))
    assert not busy(DatabaseError("Connection refused"))


READS = (["batches"], ["ranking"], ["report", "1"])


@pytest.mark.parametrize("role", ["hb"], indirect=True)
def test_a_read_command_takes_one_connection(role: Role) -> None:
    # A role allowed one connection: each read command needs no more. Before, its schema
    # check and its reads were two engines (``get_engine(url)``, ``get_engine(url, 60.0)``),
    # two pools: the second connection was refused, a traceback out of `batches`.
    role.limit(1)
    env = {"NIGHTDESK_DATABASE_URL": role.url}
    for argv in READS:
        read = run_cli(*argv, env=env)
        assert "Traceback" not in read.stderr and LIMITED not in read.stderr, read.stderr
        assert read.code in (0, 2), read.stderr  # 2: no night yet, said in one line


@pytest.mark.parametrize("role", ["hb"], indirect=True)
def test_a_read_command_waits_briefly_for_a_connection_then_says_one_line(
        role: Role, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app.cli.common, "READ_WAIT_S", 1.5)
    role.limit(0)
    env = {"NIGHTDESK_DATABASE_URL": role.url}
    for argv in READS:
        started = time.monotonic()
        read = run_cli(*argv, env=env)
        assert read.code == 2 and "Traceback" not in read.stderr, read.stderr
        [line] = [line for line in read.error_lines if line.startswith("error:")]
        assert LIMITED in line and line.endswith("(still so after 1.5 s)"), line
        assert time.monotonic() - started >= 1.0  # waited, not refused at once
    # Lifted while it waits: the command reads.
    monkeypatch.setattr(app.cli.common, "READ_WAIT_S", 30.0)
    lifted = role.lift_after(2.0)
    read = run_cli("batches", env=env)
    lifted.join(10)
    assert read.code == 0, read.stderr
    assert WAITING in read.stderr  # the refusal was met, and waited for


@pytest.mark.parametrize("role", ["hb"], indirect=True)
def test_a_later_connection_of_a_read_command_waits_the_read_wait_once_then_says_one_line(
        role: Role, monkeypatch: pytest.MonkeyPatch) -> None:
    # `report` marks dead nights crashed (a retried write) on its pooled connection, dropped
    # meanwhile while others hold every connection. Before, that connection was refused at
    # once and the write retried it for the default two-minute budget; now every connection
    # waits the one read wait (the engine's connect: ``until_taken``), then one line.
    monkeypatch.setattr(app.db.retry, "READ_WAIT_S", 1.5)
    marking = app.cli.common.mark_stale_crashed

    def server_full_meanwhile(*args: Any, **kwargs: Any) -> Any:
        role.limit(0)
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE usename = %s", [role.name])
        return marking(*args, **kwargs)

    monkeypatch.setattr(app.cli.common, "mark_stale_crashed", server_full_meanwhile)
    started = time.monotonic()
    read = run_cli("report", env={"NIGHTDESK_DATABASE_URL": role.url})
    took = time.monotonic() - started
    assert read.code == 2 and "Traceback" not in read.stderr, read.stderr
    [line] = [line for line in read.error_lines if line.startswith("error:")]
    assert line.startswith("error: the database takes no connection now (") and LIMITED in line
    assert "(still so after 1.5 s): its connections are used up by others" in line, line
    assert WAITING in read.stderr and 1.0 <= took < 10.0, took  # waited once, bounded


@pytest.mark.parametrize("role", ["hb"], indirect=True)
def test_a_page_waits_the_same_read_wait_for_a_connection_then_answers_503(
        role: Role, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same rule as a read command's (before, a page answered 503 at once): lifted within
    # the wait, the page is served; never lifted, 503 with the line, once the wait is over.
    from fastapi.testclient import TestClient

    from app.web.auth import Guard
    from app.web.reruns import RerunQueue
    from app.web.server import create_app
    from tests.unit.support.webclient import USER

    monkeypatch.setattr(app.db.retry, "READ_WAIT_S", 1.5)
    engine = get_engine(role.url)
    web = create_app(engine, Guard(USER, None), RerunQueue(), stale_after_s=120.0)
    with TestClient(web, raise_server_exceptions=False) as client:
        engine.dispose()
        role.limit(0)
        started = time.monotonic()
        answer = client.get("/api/batches")
        took = time.monotonic() - started
        assert answer.status_code == 503 and LIMITED in answer.text, answer.text[:300]
        assert "(still so after 1.5 s)" in answer.text and 1.0 <= took < 10.0, took
        engine.dispose()
        monkeypatch.setattr(app.db.retry, "READ_WAIT_S", 30.0)
        lifted = role.lift_after(1.0)
        served = client.get("/api/batches")
        lifted.join(10)
        assert served.status_code == 200, served.text[:300]


def test_a_connection_refused_after_the_first_is_said_in_one_line() -> None:
    # A later connection of a read command (its pooled one dropped, the server full
    # meanwhile): what the CLI says for it, not a traceback.
    from app.db.engine import no_connection

    refused = psycopg.OperationalError('connection failed: connection to server at "h", port '
                                       '5432 failed: FATAL:  too many connections for role "x"')
    line = no_connection(OperationalError("SELECT 1", {}, refused))
    assert line is not None and line.startswith("the database takes no connection now (")
    assert no_connection(OperationalError("SELECT 1", {}, psycopg.OperationalError(
        'FATAL:  role "x" does not exist'))) is None


def test_busy_is_read_from_the_sqlstate_where_the_error_carries_one() -> None:
    from app.db.retry import busy

    # The server's code, whatever language its words are in.
    assert busy(psycopg.errors.TooManyConnections("zu viele Verbindungen für Rolle »x«"))
    assert busy(psycopg.errors.CannotConnectNow("das Datenbanksystem startet"))
    # A code that is not a busy server's, whatever its words say.
    assert not busy(psycopg.errors.InsufficientPrivilege("too many connections, says a "
                                                         "trigger"))
