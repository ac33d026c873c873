"""Faults of single calls through the whole engine: server errors, a wrong key, cut streams."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.graph import node_names
from agents.nodes import ANALYSTS
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.db.engine import get_engine
from app.db.models import Batch, LLMCall, TickerRun
from tests.fakevllm import ChatRequest, FakeServer, Reply, default_reply
from tests.unit.support.clirun import run_cli
from tests.unit.support.engines import make_engine


def attempts_of(engine: Engine, ticker: str, node: str) -> list[tuple[int, str, int | None]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            select(LLMCall.attempt, LLMCall.status, LLMCall.http_status)
            .where(LLMCall.ticker == ticker, LLMCall.node == node).order_by(LLMCall.attempt))]


async def test_500_twice_then_200_is_three_attempts_three_rows_and_a_success(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(2)
    flaky = tickers[0]
    seen: Counter[str] = Counter()

    def script(chat: ChatRequest) -> Reply | None:
        if chat.ticker == flaky and chat.node == "trader":
            seen["trader"] += 1
            if seen["trader"] <= 2:
                return Reply(status=500, error="engine hiccup")
        return None

    server = FakeServer(script, nodes=node_names(load_settings().pipeline()), tickers=tickers)
    outcome = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.status == "succeeded" and sorted(outcome.succeeded) == sorted(tickers)
    assert len(server.by_node("trader")) == 1 + 3  # the other ticker's one, and these three
    assert attempts_of(sqlite_engine, flaky, "trader") == [
        (1, "error", 500), (2, "error", 500), (3, "ok", None)]


def test_a_wrong_key_stops_the_batch_at_once_with_one_line(
        monkeypatch: pytest.MonkeyPatch, demo_dir: Path, sqlite_url: str) -> None:
    tickers = demo_tickers(3)
    server = FakeServer(lambda chat: Reply(status=401, error="Incorrect API key provided"),
                        nodes=node_names(load_settings().pipeline()), tickers=tickers)
    original = BatchEngine.__init__

    def with_fake(self: BatchEngine, *args: object, **kwargs: object) -> None:
        kwargs.update(http_client=server.client(), sample_metrics=False)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(BatchEngine, "__init__", with_fake)
    result = run_cli("run", "--tickers", ",".join(tickers), "--no-preflight",
                     env={"NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 2, result.stderr  # a configuration error, not a partial night
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "401" in errors[0] and "Incorrect API key provided" in errors[0]
    assert "NIGHTDESK_LLM_API_KEY" in errors[0]  # says what to fix
    # At once: no retries of a 401, and nothing past the first wave (the tickers adaptive
    # starts in one pass send their four analysts together; no later node is reached).
    assert all(chat.attempt == 1 for chat in server.chats)
    assert {chat.node for chat in server.chats} <= set(ANALYSTS)
    assert len(server.chats) <= len(ANALYSTS) * len(tickers)
    with get_engine(sqlite_url).connect() as conn:
        status, error = conn.execute(select(Batch.status, Batch.error)).one()
        runs = Counter(conn.execute(select(TickerRun.status)).scalars())
    assert status == "failed" and "401" in error
    assert runs["failed"] == 0  # not counted as tickers that failed: the batch was stopped


async def test_a_cut_stream_is_retried_and_its_fragment_never_used(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(1)
    cut: Counter[str] = Counter()

    def script(chat: ChatRequest) -> Reply | None:
        # The trader's answer is cut twice (a dropped connection, then a stream that just
        # stops), then comes whole; the risk analysts and the manager read the trader's plan.
        if chat.node == "trader":
            cut["trader"] += 1
            if cut["trader"] == 1:
                return Reply("FRAGMENT-ONE " * 3, cut_after=1, cut="drop")
            if cut["trader"] == 2:
                return Reply("FRAGMENT-TWO " * 3, cut_after=1, cut="end")
            return Reply("WHOLE-PLAN: buy on dips, stop at -8%.")
        return default_reply(chat)

    server = FakeServer(script, nodes=node_names(load_settings().pipeline()), tickers=tickers)
    outcome = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.status == "succeeded"
    later = [c for c in server.chats if c.node and c.node.startswith(
        ("aggressive", "conservative", "neutral", "portfolio_manager"))]
    assert later and all("WHOLE-PLAN" in json.dumps(c.body) for c in later)
    assert not any("FRAGMENT" in json.dumps(c.body) for c in server.chats
                   if c.node != "trader")
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(LLMCall.attempt, LLMCall.status, LLMCall.error_class)
                            .where(LLMCall.node == "trader").order_by(LLMCall.attempt)).all()
    assert [tuple(r) for r in rows] == [(1, "error", "connection"), (2, "error", "stream"),
                                        (3, "ok", None)]


async def test_a_malformed_chunk_is_retried_and_one_that_stays_fails_its_ticker_in_one_line(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(3)
    once, always = tickers[0], tickers[1]
    seen: Counter[str] = Counter()

    def script(chat: ChatRequest) -> Reply | None:
        if chat.node == "trader" and chat.ticker in (once, always):
            seen[chat.ticker] += 1
            if chat.ticker == always or seen[chat.ticker] == 1:
                return Reply("HALF A PLAN " * 3, cut_after=1, cut="garbage")
        return None

    server = FakeServer(script, nodes=node_names(load_settings().pipeline()), tickers=tickers)
    outcome = await make_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert sorted(outcome.succeeded) == sorted([once, tickers[2]])
    assert list(outcome.failed) == [always]
    assert [(a, s) for a, s, _ in attempts_of(sqlite_engine, once, "trader")] == [
        (1, "error"), (2, "ok")]
    with sqlite_engine.connect() as conn:
        classes = set(conn.execute(select(LLMCall.error_class)
                                   .where(LLMCall.status == "error")).scalars())
        error = conn.execute(select(TickerRun.error).where(TickerRun.ticker == always)).scalar()
    assert classes == {"malformed"}
    assert error is not None and "\n" not in error and "malformed stream chunk" in error
    assert "Traceback" not in error and "JSONDecodeError" in error
