"""Check the tenacity retry policies: database writes, the usage writer, the /tokenize count.

A database write (app/db/retry.py) is tried again on transient errors only (the
connection, a lock, a full disk: by SQLSTATE class or SQLite's code), with delays that
double from 0.2 s to 5 s, half of each jittered, within a two-minute budget (or the one a
batch sets, which reaches its threads); each
retry logs one warning and the last error comes out unchanged. The usage writer's rows go
through the same policy; when it gives up it says so to the batch, to ``drain`` and to
``close``. The budget tests run on a fake clock put into tenacity's own ``time``. A
prompt's count (app/promptsize.py) is tried ``max_attempts`` times on what may pass,
waits for the server between tries, and gives None when it cannot count.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
import pytest
import structlog
import tenacity
import tenacity.nap
from sqlalchemy import create_engine
from sqlalchemy.exc import DataError, IntegrityError, InternalError, OperationalError

import app.usage
from agents.fitting import PromptSize
from app.config import load_settings
from app.db.retry import (
    FIRST_DELAY_S,
    MAX_DELAY_S,
    RETRY_BUDGET_S,
    aretrying,
    budget_s,
    mark_bound,
    outage,
    retried,
    retrying,
    said,
    transient,
    write_budget,
)
from app.errors import BatchStopped, LLMConnectionError, LLMHTTPError, UsageLost, first_line
from app.promptsize import PromptCounter
from app.usage import UsageRecorder
from tests.fakevllm import FakeServer, Reply
from tests.unit.support.call_rows import told

MESSAGES = [{"role": "user", "content": "AAPL? " * 40}]


def locked() -> OperationalError:
    return OperationalError("UPDATE t", {}, sqlite3.OperationalError("database is locked"))


def test_an_error_said_in_one_line_is_the_drivers_own_first_line() -> None:
    # Every log line and stored error names a failure this way (retries, the usage writer,
    # the lock, the sampler, a batch's stored error).
    assert first_line(locked()) == "database is locked"  # not SQLAlchemy's "(sqlite3...) [SQL"
    assert first_line(ValueError("first\nsecond")) == "first"
    assert first_line(ValueError("x" * 300)) == "x" * 200
    assert first_line(ValueError("  ")) == "ValueError"  # says nothing: its type
    # typed: a foreign error says what it is; nightdesk's own need not.
    assert first_line(ValueError("bad"), typed=True) == "ValueError: bad"
    assert first_line(locked(), typed=True) == "OperationalError: database is locked"
    assert first_line(LLMHTTPError("HTTP 500"), typed=True) == "HTTP 500"
    assert first_line(KeyError("k"), 5, typed=True) == "KeyEr"


def warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "database write failed; retrying"]


class FakeClock:
    """A monotonic clock that moves only when tenacity sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        # A guard, not an expectation: a clock that did not move would loop for ever.
        assert len(self.sleeps) < 500, "the fake clock is not the one tenacity reads"
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    namespace = SimpleNamespace(monotonic=fake.monotonic, sleep=fake.sleep)
    monkeypatch.setattr(tenacity, "time", namespace)
    monkeypatch.setattr(tenacity.nap, "time", namespace)
    return fake


def test_a_write_failing_for_good_gives_up_within_the_budget_with_its_last_error(
        clock: FakeClock) -> None:
    raised: list[OperationalError] = []

    def write() -> None:
        raised.append(locked())
        raise raised[-1]

    with structlog.testing.capture_logs() as logs, pytest.raises(OperationalError) as caught:
        retrying(write)
    assert caught.value is raised[-1]  # the error itself, not a wrapper
    start = 1000.0
    # Within the budget, and not given up early: no further delay would have fitted.
    assert RETRY_BUDGET_S - MAX_DELAY_S <= clock.now - start <= RETRY_BUDGET_S
    assert len(clock.sleeps) == len(raised) - 1
    for n, slept in enumerate(clock.sleeps):
        delay = min(FIRST_DELAY_S * 2 ** n, MAX_DELAY_S)
        assert delay / 2 <= slept <= delay, (n, slept)
    # Jittered: writers that failed together do not all come back together.
    assert len({round(s, 6) for s in clock.sleeps}) > len(clock.sleeps) // 2
    lines = warnings(logs)
    assert [e["tries"] for e in lines] == list(range(1, len(raised)))
    assert {e["write"] for e in lines} == {"write"}
    assert {e["error"] for e in lines} == {"database is locked"}
    assert all(e["log_level"] == "warning" for e in lines)


def test_a_write_that_cannot_pass_is_not_tried_again(clock: FakeClock) -> None:
    tries = []

    @retried
    def insert() -> None:
        tries.append(1)
        raise IntegrityError("INSERT INTO t", {}, sqlite3.IntegrityError("UNIQUE failed"))

    no_table = OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: t"))

    def select() -> None:
        tries.append(1)
        raise no_table

    with structlog.testing.capture_logs() as logs:
        with pytest.raises(IntegrityError):
            insert()
        with pytest.raises(OperationalError) as caught:
            retrying(select)
    assert caught.value is no_table
    assert len(tries) == 2 and clock.sleeps == [] and warnings(logs) == []


def test_a_decorated_write_passes_once_the_database_is_back(clock: FakeClock) -> None:
    failures = [locked(), locked()]

    @retried
    def store(value: int) -> int:
        if failures:
            raise failures.pop(0)
        return value * 2

    with structlog.testing.capture_logs() as logs:
        assert store(21) == 42
    assert store.__name__ == "store"
    assert [(e["write"], e["tries"]) for e in warnings(logs)] == [("store", 1), ("store", 2)]
    assert len(clock.sleeps) == 2


async def test_an_awaited_write_is_retried_on_transient_errors_only() -> None:
    failures = [locked()]

    async def checkpoint(value: str) -> str:
        if failures:
            raise failures.pop(0)
        return value

    with structlog.testing.capture_logs() as logs:
        assert await aretrying(checkpoint, "saved") == "saved"  # one real wait: ≤ 0.2 s
    assert [(e["write"], e["tries"]) for e in warnings(logs)] == [("checkpoint", 1)]

    calls = []

    async def bad() -> None:
        calls.append(1)
        raise ValueError("not a database error")

    with pytest.raises(ValueError, match="not a database error"):
        await aretrying(bad)
    assert calls == [1]


def tokenize(answers: list[int]) -> FakeServer:
    """Return a fake whose /tokenize answers the statuses given, then 200s (70 of 100)."""
    server = FakeServer(tokenize_count=70, max_model_len=100)
    for status in answers:
        server.cue(Reply(status=status), path="/tokenize")
    return server


@pytest.mark.parametrize(
    ("answers", "expected", "tries"),
    [
        ([503, 503], PromptSize(70, 100 - 10), 3),  # passes on the last of three tries
        ([503, 503, 503], None, 3),  # fails every try: not counted
        ([400], None, 1),  # ours, it would fail again: not tried again
    ],
)
async def test_a_prompt_count_is_tried_again_while_the_server_may_pass(
        answers: list[int], expected: PromptSize | None, tries: int) -> None:
    settings = load_settings(max_attempts=3, context_check_includes_output=True)
    server = tokenize(answers)
    async with server.client() as http:
        counter = PromptCounter(settings, http, "http://server/tokenize")
        with structlog.testing.capture_logs() as logs:
            size = await counter.measure(MESSAGES, max_tokens=10, exact=True)
    assert size == expected
    assert server.tokenize_calls == tries
    gave_up = [e for e in logs if e["event"] == "prompt could not be counted"]
    assert len(gave_up) == (expected is None)


async def test_a_count_the_server_kept_failing_raises_for_its_client_to_judge() -> None:
    server = tokenize([503, 503, 503])
    async with server.client() as http:
        counter = PromptCounter(load_settings(max_attempts=3), http, "http://server/tokenize")
        with pytest.raises(LLMHTTPError):  # app.traffic.client waits for the server on it
            await counter.size(MESSAGES, max_tokens=10, exact=True)
    assert server.tokenize_calls == 3  # its own tries first


async def test_a_server_never_reached_is_not_counted() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        counter = PromptCounter(load_settings(max_attempts=2), http, "http://server/tokenize")
        with pytest.raises(LLMConnectionError):
            await counter.count("m", MESSAGES)  # one try: count() itself does not retry
        assert await counter.measure(MESSAGES, max_tokens=10, exact=True) is None


class Rows:
    """Stand in for the usage writer's insert: fail while ``down`` says so, else keep."""

    def __init__(self, clock: FakeClock, down: Callable[[float], BaseException | None]) -> None:
        self.clock = clock
        self.down = down
        self.stored: list[dict[str, Any]] = []
        self.tries = 0

    def insert(self, engine: Any, table: Any, rows: list[dict[str, Any]]) -> None:
        self.tries += 1
        error = self.down(self.clock.now - 1000.0)
        if error is not None:
            raise error
        self.stored.extend(rows)


@dataclass
class Written:
    """What the usage writer did with one row: what the batch waiting on ``stopped`` was
    told, and what ``drain`` and ``close`` said."""

    recorder: UsageRecorder
    lost: list[BatchStopped]
    drained: UsageLost | None
    closed: UsageLost | None


async def write_one_row(clock: FakeClock, rows: Rows,
                        monkeypatch: pytest.MonkeyPatch) -> Written:
    """Hand the usage writer one row, wait until it is stored, and close the writer."""
    monkeypatch.setattr(app.usage, "insert_ignoring_duplicates", rows.insert)
    lost: list[BatchStopped] = []

    async def nap(seconds: float) -> None:
        clock.sleep(seconds)

    recorder = UsageRecorder(create_engine("sqlite://"), flush_interval_s=0.001, sleep=nap)
    said: list[UsageLost | None] = []  # what the drain raised, then what the exit raised
    try:
        async with recorder:
            telling = asyncio.create_task(told(recorder, lost))
            recorder.record_call({"batch_id": 1, "ticker": "X", "node": "n", "call_id": "c",
                                  "attempt": 1})
            try:
                await recorder.drain()
                said.append(None)
            except UsageLost as error:
                said.append(error)
        said.append(None)
    except UsageLost as error:
        said.append(error)
    telling.cancel()
    return Written(recorder, lost, *said)


async def test_the_usage_writer_stores_rows_once_the_database_is_back_within_the_budget(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    back_at = RETRY_BUDGET_S - 2 * MAX_DELAY_S
    rows = Rows(clock, lambda t: locked() if t < back_at else None)
    with structlog.testing.capture_logs() as logs:
        written = await write_one_row(clock, rows, monkeypatch)
    assert [r["call_id"] for r in rows.stored] == ["c"]
    assert (written.lost, written.drained, written.closed) == ([], None, None)
    assert back_at <= clock.now - 1000.0 < RETRY_BUDGET_S
    tried_again = [e for e in logs if e["event"] == "usage write failed; will retry"]
    assert written.recorder.write_failures == len(tried_again) == len(clock.sleeps)
    assert len(clock.sleeps) == rows.tries - 1 > 10


async def test_the_usage_writer_gives_up_at_the_budget_and_says_so_everywhere(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = Rows(clock, lambda t: locked())
    with structlog.testing.capture_logs() as logs:
        written = await write_one_row(clock, rows, monkeypatch)
    # Not before the budget (no further try would have fitted), not after it.
    assert RETRY_BUDGET_S - MAX_DELAY_S <= clock.now - 1000.0 <= RETRY_BUDGET_S
    assert rows.stored == []
    # The batch is told (it halts), and whoever waits for the row or closes the writer
    # gets the same one-line error.
    assert written.lost == [written.drained] == [written.closed]
    assert str(written.drained) == ("usage rows could not be stored (1 not written): "
                                    "database is locked")
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["usage writer gave up"]


async def test_rows_the_database_refuses_stop_the_usage_writer_at_once(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    too_long = DataError("INSERT INTO llm_calls", {}, Exception("value too long"))
    written = await write_one_row(clock, Rows(clock, lambda t: too_long), monkeypatch)
    assert clock.sleeps == []
    assert written.lost == [written.drained] == [written.closed]
    assert written.drained is not None and written.drained.exit_code == 2
    assert str(written.drained).endswith("value too long")


@pytest.mark.parametrize("error", [
    psycopg.errors.DiskFull('could not extend file "base/1/2": No space left on device'),
    psycopg.errors.OutOfMemory("out of memory"),
    psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    psycopg.errors.CannotConnectNow("the database system is starting up"),
    psycopg.errors.ConnectionFailure("server conn crashed?"),
    sqlite3.OperationalError("database or disk is full"),
], ids=lambda e: type(e).__name__)
def test_a_full_disk_or_a_server_going_away_is_transient(error: Exception) -> None:
    # By the SQLSTATE class (08, 53, 57P), whatever the words: a trigger or a translation
    # may say it otherwise. Wrapped by SQLAlchemy or as the driver raised it.
    assert transient(error)
    assert transient(OperationalError("INSERT INTO llm_calls", {}, error))


def test_a_statement_that_cannot_pass_is_not_transient() -> None:
    assert not transient(psycopg.errors.UndefinedTable('relation "nope" does not exist'))
    assert not transient(psycopg.errors.StringDataRightTruncation("value too long"))
    assert not transient(sqlite3.OperationalError("no such table: nope"))


def test_a_database_that_takes_no_writes_is_waited_for_by_a_batch_only() -> None:
    # SQLSTATE 25006: a hot standby at the primary's address (a failover), or
    # default_transaction_read_only. A batch's writes wait for it as for a database away;
    # a read command's one write (marking a dead batch crashed) is left out at once.
    error = psycopg.errors.ReadOnlySqlTransaction(
        "cannot execute INSERT in a read-only transaction")
    wrapped = InternalError("INSERT INTO llm_calls", {}, error)
    assert not transient(error) and not transient(wrapped)
    with write_budget(10.0):
        assert transient(error) and transient(wrapped)
    invalidated = InternalError("INSERT INTO llm_calls", {}, error,
                                connection_invalidated=True)
    assert not transient(invalidated)  # given up by the engine, still not waited for here


def test_a_sqlite_file_that_cannot_be_written_is_waited_for_by_a_batch_only(
        tmp_path: Path) -> None:
    # The real errors with their real codes: a file opened read-only says "attempt to write
    # a readonly database" (SQLITE_READONLY), as one opened after its filesystem went
    # read-only does; a write through a file opened before says "disk I/O error"
    # (SQLITE_IOERR_WRITE, EROFS; tests/integration/test_read_only_home.py meets it on a
    # real ext4). The database is as good as away: a batch waits for it within its budget.
    path = tmp_path / "night.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE t (x)")
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn, \
            pytest.raises(sqlite3.OperationalError) as refused:
        conn.execute("INSERT INTO t VALUES (1)")
    io_error = sqlite3.OperationalError("disk I/O error")
    io_error.sqlite_errorcode = sqlite3.SQLITE_IOERR_WRITE  # type: ignore[attr-defined]
    for error in (refused.value, io_error):
        wrapped = OperationalError("INSERT INTO llm_calls", {}, error)
        assert not transient(error) and not transient(wrapped)  # a read command's write
        with write_budget(10.0):
            assert transient(error) and transient(wrapped)
        assert "(the database file cannot be written: its filesystem read-only" in said(
            wrapped)
    assert refused.value.sqlite_errorcode == sqlite3.SQLITE_READONLY


def test_a_database_host_name_the_resolver_cannot_look_up_for_now_is_waited_for() -> None:
    # EAI_AGAIN (the resolver's server unreachable a while) as psycopg says it when a new
    # connection's host name does not resolve: mid-night it passes as a restart does. A name
    # that does not exist (EAI_NONAME) is no passing state.
    again = psycopg.OperationalError("failed to resolve host 'db.internal': [Errno -3] "
                                     "Temporary failure in name resolution")
    assert transient(again) and transient(OperationalError("SELECT 1", {}, again))
    assert not transient(psycopg.OperationalError(
        "failed to resolve host 'db.internl': [Errno -2] Name or service not known"))


async def test_a_batch_write_budget_reaches_writes_decorated_at_import_and_their_threads(
        clock: FakeClock) -> None:
    @retried
    def write() -> None:
        raise locked()

    with write_budget(10.0):
        assert budget_s() == 10.0
        with pytest.raises(OperationalError):
            await asyncio.to_thread(write)  # the budget travels with the thread's context
    assert 10.0 - MAX_DELAY_S <= clock.now - 1000.0 <= 10.0
    assert budget_s() == RETRY_BUDGET_S  # outside the batch, the default again


def _cancelled(sqlstate: str = "57014",
               words: str = "canceling statement due to statement timeout") -> BaseException:
    error = psycopg.errors.lookup(sqlstate)(words)
    return OperationalError("UPDATE batches ...", {}, error)


def test_a_statement_cancelled_at_its_bound_is_said_with_the_setting_and_its_value() -> None:
    # PostgreSQL's words name neither the setting nor its value: the stop's line does. The
    # engines mark each error with their bound (app.db.engine.bounded); unmarked, the
    # setting alone; a cancel for another reason (an operator's pg_cancel_backend) is as is.
    marked = _cancelled()
    mark_bound(marked.orig, 2.5)  # type: ignore[attr-defined]
    assert str(outage("checkpoint not stored", marked)) == (
        "checkpoint not stored within the write budget (120 s): canceling statement due to "
        "statement timeout (NIGHTDESK_DB_STATEMENT_TIMEOUT_S (2.5 s))")
    assert said(_cancelled()) == ("canceling statement due to statement timeout "
                                  "(NIGHTDESK_DB_STATEMENT_TIMEOUT_S)")
    by_hand = _cancelled(words="canceling statement due to user request")
    mark_bound(by_hand.orig, 2.5)  # type: ignore[attr-defined]
    assert said(by_hand) == "canceling statement due to user request"
    assert said(_cancelled("57P01", "terminating connection due to administrator command")) \
        == "terminating connection due to administrator command"
