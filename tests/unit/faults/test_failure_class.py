"""Whose failure a ticker's is, and what a resume does with it.

A ticker the infrastructure failed (server errors on every attempt) keeps its checkpoints
and `run --resume` / `run --continue-night` take it up from its last finished node; one
that failed on its own account (a prompt too long for the server) stays failed unless
`run --resume N --retry-failed` asks for it.
"""

from __future__ import annotations

import errno
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jinja2 import TemplateNotFound
from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError, OperationalError

from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.batch import store
from app.batch.faults import INFRASTRUCTURE, OWN, failure_class
from app.config import load_settings
from app.db.models import Batch, Decision, LLMCall
from app.errors import (
    ContextLengthError,
    DataError,
    DecisionError,
    LLMConnectionError,
    LLMHTTPError,
    LLMMalformedError,
    LLMStreamError,
    LLMTimeoutError,
)
from app.runs.nightly import NightlyRequest, run_nightly
from tests.fakevllm import CONTEXT_LENGTH_MESSAGE, ChatRequest, FakeServer, Reply
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import (
    NODES,
    QUICK,
    QUICK_ENV,
    assert_rows_match_the_servers,
    serve_cli_from,
    ticker_states,
)

TICKERS = demo_tickers(2)
FLAKY, STEADY = TICKERS


@pytest.mark.parametrize(("error", "whose"), [
    (LLMHTTPError("HTTP 429", http_status=429), INFRASTRUCTURE),
    (LLMHTTPError("HTTP 500", http_status=500), INFRASTRUCTURE),
    (LLMHTTPError("HTTP 503", http_status=503), INFRASTRUCTURE),
    (LLMConnectionError("cannot reach"), INFRASTRUCTURE),
    (LLMTimeoutError("no complete answer"), INFRASTRUCTURE),
    (LLMStreamError("stream ended without a finish reason"), INFRASTRUCTURE),
    (LLMMalformedError("malformed stream chunk"), INFRASTRUCTURE),
    (OperationalError("UPDATE", {}, sqlite3.OperationalError("database is locked")),
     INFRASTRUCTURE),
    (OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full")),
     INFRASTRUCTURE),
    (OSError(errno.ENOSPC, "No space left on device"), INFRASTRUCTURE),
    (TemplateNotFound("_context.j2"), INFRASTRUCTURE),
    (LLMHTTPError("HTTP 400", http_status=400), OWN),
    (ContextLengthError("too long", http_status=400), OWN),
    (DecisionError("the decision failed its schema"), OWN),
    (DataError("no prices"), OWN),
    (IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE failed")), OWN),
    (OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: t")), OWN),
    (KeyError("decision"), OWN),
])
def test_a_failure_is_the_infrastructures_only_when_it_may_pass_with_time(
        error: BaseException, whose: str) -> None:
    assert failure_class(error) == whose


def invoke(*argv: str) -> tuple[int, str]:
    """Run ``nightdesk ARGV`` as an operator would; return its exit code and stderr."""
    result = run_cli(*argv, "--no-preflight", env=QUICK_ENV)
    return result.code, result.stderr


NIGHT = ("run", "--tickers", ",".join(TICKERS), "--as-of", str(DEMO_AS_OF))


def test_a_ticker_the_server_failed_is_taken_up_by_resume_from_its_last_node(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    broken = [True]
    server = FakeServer(lambda chat: Reply(status=500, error="engine hiccup")
                        if broken[0] and (chat.ticker, chat.node) == (FLAKY, "trader")
                        else None, nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, server, demo_dir)
    code, said = invoke(*NIGHT)
    assert code == 3, said  # partial: the night ran, one ticker is missing
    batch_id = 1
    assert ticker_states(sqlite_engine, batch_id) == {
        FLAKY: ("failed", INFRASTRUCTURE), STEADY: ("succeeded", None)}
    assert (f"1 of them failed to the infrastructure (the server or the database), not on "
            f"its own account: `nightdesk run --resume {batch_id}` runs it again") in said
    before = len(server.chats)
    broken[0] = False
    code, said = invoke("run", "--resume")  # the newest batch with tickers left: this one
    assert code == 0, said
    assert (f"resuming batch {batch_id} (nightly, partial, as of {DEMO_AS_OF}): 1 ticker left, "
            "1 finished") in said  # not "1 tickers left"
    assert "taken up: 1 failed to the infrastructure (the server or the database)" in said
    # By node: the trader and what follows it; nothing before it is called again.
    again = [chat.node for chat in server.chats[before:]]
    assert again[0] == "trader" and sorted(again) == sorted(NODES[NODES.index("trader"):])
    assert ticker_states(sqlite_engine, batch_id) == dict.fromkeys(
        TICKERS, ("succeeded", None))
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status, Batch.tickers_failed)).one() == (
            "succeeded", 0)
        assert conn.execute(select(LLMCall.http_status).where(
            LLMCall.node == "trader", LLMCall.ticker == FLAKY)).scalars().all() == [
            500, 500, 500, None]
    assert_rows_match_the_servers(sqlite_engine, batch_id, [server])


def partial_night(monkeypatch: pytest.MonkeyPatch, demo_dir: Path) -> FakeServer:
    """Run the night with FLAKY's market call answered 502 (partial, exit 3), then mend the
    server; return it."""
    broken = [True]
    server = FakeServer(lambda chat: Reply(status=502) if broken[0] and chat.ticker == FLAKY
                        and chat.node == "market" else None, nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, server, demo_dir)
    assert invoke(*NIGHT)[0] == 3
    broken[0] = False
    return server


def test_continue_night_takes_up_a_partial_night_the_server_cost(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    partial_night(monkeypatch, demo_dir)
    code, said = invoke(*NIGHT, "--continue-night")
    assert code == 0, said
    assert "resuming batch 1 (nightly, partial" in said  # not a second night beside it
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.id, Batch.status)).all() == [(1, "succeeded")]


def test_continue_night_leaves_a_partial_night_whose_failed_tickers_a_rerun_rated(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    # The operator reran the ticker the server failed: the ranking shows the rerun's rating.
    # The timer's `--continue-night` still resumed the night, ran the ticker again in it,
    # and the ranking went on showing the rerun's rating, not the night's newer one.
    server = partial_night(monkeypatch, demo_dir)
    assert invoke("rerun", FLAKY, "--as-of", str(DEMO_AS_OF))[0] == 0
    before = len(server.chats)
    code, said = invoke(*NIGHT, "--continue-night")
    assert code == 0, said
    assert "resuming batch 1" not in said and len(server.chats) == before, said
    assert "nightly batch #1 has already analyzed" in said
    assert "nightdesk run --resume" not in said  # nor advised instead
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.id, Batch.status).order_by(Batch.id)).all() == [
            (1, "partial"), (2, "succeeded")]


def test_the_daemons_fire_takes_up_a_partial_night_the_server_cost(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    fired = datetime.now(UTC)
    broken = [True]
    server = FakeServer(lambda chat: Reply(status=500) if broken[0] and chat.ticker == FLAKY
                        and chat.node == "trader" else None, nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, server, demo_dir)
    assert invoke(*NIGHT)[0] == 3
    broken[0] = False
    # What the scheduler daemon runs when it fires for the night (app/runs/daemon.py).
    settings = load_settings(**QUICK, data_dir=demo_dir)
    night = run_nightly(settings, NightlyRequest(as_of=DEMO_AS_OF, tickers=",".join(TICKERS)),
                        engine=sqlite_engine, resume=True, skip_if_finished_since=fired,
                        server="skip")
    assert night.resumed is not None and night.resumed.infrastructure == 1
    assert night.outcome is not None and night.outcome.status == "succeeded"
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.id, Batch.status)).all() == [(1, "succeeded")]
    # Done now: the same fire skips it.
    assert run_nightly(settings, NightlyRequest(as_of=DEMO_AS_OF), engine=sqlite_engine,
                       resume=True, skip_if_finished_since=fired,
                       server="skip").outcome is None


def test_a_ticker_failed_on_its_own_stays_failed_unless_asked(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    too_long = [True]

    def script(chat: ChatRequest) -> Reply | None:
        if too_long[0] and (chat.ticker, chat.node) == (FLAKY, "trader"):
            return Reply(status=400, error=CONTEXT_LENGTH_MESSAGE)
        return None

    server = FakeServer(script, nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, server, demo_dir)
    assert invoke(*NIGHT)[0] == 3
    assert ticker_states(sqlite_engine, 1)[FLAKY] == ("failed", OWN)
    code, said = invoke("run", "--resume")
    assert code == 2 and "no batch to resume" in said and "--retry-failed" in said
    code, said = invoke("run", "--resume", "1")
    assert code == 2
    assert ("batch 1 (partial) has no tickers left to run; 1 failed on their own account: "
            "`nightdesk run --resume 1 --retry-failed` runs them again") in said
    too_long[0] = False
    code, said = invoke("run", "--resume", "1", "--retry-failed")
    assert code == 0, said
    assert "taken up: 1 failed on their own account (--retry-failed)" in said
    assert ticker_states(sqlite_engine, 1) == dict.fromkeys(TICKERS, ("succeeded", None))


def test_retry_failed_without_resume_is_refused_in_one_line(sqlite_engine: Engine) -> None:
    result = run_cli("run", "--retry-failed")
    assert result.code == 2 and len(result.error_lines) == 1
    assert "--retry-failed goes with --resume" in result.error_lines[0]
    assert "Traceback" not in result.stderr


def test_a_result_the_database_would_not_take_is_stored_on_resume_without_a_call(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    # The database is away (locked past the write budget) when FLAKY's decisions are
    # stored: the night stops resumable (no ticker failed for it), FLAKY keeps its finished
    # run, and the resume stores it from its checkpoints without calling the server again.
    real = store.ticker_finished
    away = [True]

    def ticker_finished(engine: Engine, batch_id: int, ticker: str, decisions: list[Any],
                        error: str | None, failure_class: str | None = None) -> None:
        if away[0] and ticker == FLAKY and decisions:
            raise OperationalError("INSERT INTO decisions", {},
                                   sqlite3.OperationalError("database is locked"))
        real(engine, batch_id, ticker, decisions, error, failure_class)

    monkeypatch.setattr(store, "ticker_finished", ticker_finished)
    server = FakeServer(nodes=NODES, tickers=TICKERS)
    serve_cli_from(monkeypatch, server, demo_dir)
    code, said = invoke(*NIGHT)
    assert code == 2, said
    assert "ticker result not stored within the write budget" in said
    assert "nightdesk run --resume 1" in said
    assert all(state != "failed" for state, _ in ticker_states(sqlite_engine, 1).values())
    away[0] = False
    calls = len(server.chats)
    code, said = invoke("run", "--resume", "1")
    assert code == 0, said
    # FLAKY's run was whole: nothing of it is asked again (STEADY, cut by the stop, may be)
    assert [chat for chat in server.chats[calls:] if chat.ticker == FLAKY] == []
    assert ticker_states(sqlite_engine, 1) == dict.fromkeys(TICKERS, ("succeeded", None))
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Decision.ticker).where(Decision.batch_id == 1)
                            .order_by(Decision.ticker)).scalars().all() == sorted(TICKERS)
