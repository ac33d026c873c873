"""Faults of the LLM server at moments earlier passes did not try (docs/lab/
2026-12-07-faults-outside-2.md): a stream cut or malformed mid-debate and during the last
ticker, a 429 with Retry-After mid-debate, a restart mid-debate and during the last ticker,
a burst during a resume. Each on SQLite through the fake at the HTTP edge: every ticker
succeeds, ``llm_calls`` is the server's request log (one row per attempt, each call
answered once), and each sample has one decision."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF
from app.batch.engine import BatchPlan
from app.db.models import Decision
from app.runs.resumable import find_resumable
from tests.fakevllm import ChatRequest, FakeServer, Reply
from tests.fakevllm.chat import default_reply
from tests.unit.support.bursts import TICKERS
from tests.unit.support.fault_night import (
    NODES,
    assert_rows_match_the_servers,
    night_engine,
    ticker_states,
)

DEBATE = "bear_r1"
LAST = (TICKERS[-1], "portfolio_manager")


def at(node: str, ticker: str | None = None) -> Callable[[ChatRequest], bool]:
    """The first attempt of ``node``'s call (of ``ticker``, given one)."""
    return lambda chat: chat.node == node and chat.attempt == 1 and \
        (ticker is None or chat.ticker == ticker)


def once(where: Callable[[ChatRequest], bool], **fault: Any) -> Callable[[ChatRequest], Any]:
    """Answer the request ``where`` picks with its usual reply, broken by ``fault``."""
    def script(chat: ChatRequest) -> Any:
        if not where(chat):
            return None
        usual = default_reply(chat)
        return replace(Reply(content=usual) if isinstance(usual, str) else usual, **fault)
    return script


def restart(where: Callable[[ChatRequest], bool], server: list[FakeServer]
            ) -> Callable[[ChatRequest], Any]:
    """Crash the server on the request ``where`` picks, and bring it back 0.3 s later."""
    async def script(chat: ChatRequest) -> Any:
        if where(chat):
            server[0].crash()
            asyncio.get_running_loop().call_later(0.3, server[0].revive)
            return Reply(drop=True)
        return None
    return script


def cut_at(where: Callable[[ChatRequest], bool], cut: str
           ) -> Callable[[list[FakeServer]], Any]:
    return lambda _: once(where, cut_after=1, cut=cut)


CASES: dict[str, Callable[[list[FakeServer]], Any]] = {
    **{f"cut-{cut}-{name}": cut_at(where, cut)
       for cut in ("drop", "end", "garbage", "misshapen")
       for name, where in (("debate", at(DEBATE)), ("last-ticker", at(LAST[1], LAST[0])))},
    "malformed-json-at-once-last-ticker": lambda _: once(at(LAST[1], LAST[0]), cut_after=0,
                                                         cut="garbage"),
    "restart-debate": lambda s: restart(at(DEBATE), s),
    "restart-last-ticker": lambda s: restart(at(LAST[1], LAST[0]), s),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_fault_at_this_moment_costs_no_ticker_and_counts_each_attempt_once(
        sqlite_engine: Engine, demo_dir: Path, case: str) -> None:
    holder: list[FakeServer] = []
    server = FakeServer(CASES[case](holder), nodes=NODES, tickers=TICKERS)
    holder.append(server)
    outcome = asyncio.run(night_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, TICKERS)))
    assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
    assert any(c.attempt > 1 for c in server.chats)  # the fault was met, and retried
    assert ticker_states(sqlite_engine, outcome.batch_id) == dict.fromkeys(
        TICKERS, ("succeeded", None))
    assert_rows_match_the_servers(sqlite_engine, outcome.batch_id, [server])
    with sqlite_engine.connect() as conn:
        decisions = Counter(conn.execute(select(Decision.ticker, Decision.sample)).all())
    assert set(decisions.values()) == {1} and len(decisions) == len(TICKERS)


def test_a_429_with_retry_after_mid_debate_is_waited_out(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    server = FakeServer(nodes=NODES, tickers=TICKERS)
    server.burst(429, 6, node=DEBATE, retry_after="1")
    outcome = asyncio.run(night_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, TICKERS)))
    assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
    assert server.burst_answers == 6
    assert_rows_match_the_servers(sqlite_engine, outcome.batch_id, [server])


def test_a_burst_during_the_resume_is_waited_out(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    # The night stops half-way (a burst past a tiny outage budget); its resume meets a
    # burst of its own, within the budget: waited out, every ticker succeeds, the rows
    # of both runs equal both servers' logs.
    first = FakeServer(nodes=NODES, tickers=TICKERS)
    first.burst(503, 10_000, at=12)
    stopped = asyncio.run(night_engine(sqlite_engine, demo_dir, first, outage_budget_s=0.3)
                          .run(BatchPlan("nightly", DEMO_AS_OF, TICKERS)))
    assert stopped.status == "interrupted" and not stopped.failed, stopped
    second = FakeServer(nodes=NODES, tickers=TICKERS)
    second.burst(503, 8, at=2, retry_after="1")
    resumed = asyncio.run(night_engine(sqlite_engine, demo_dir, second).run(
        find_resumable(sqlite_engine, stopped.batch_id, stale_s=120)))
    assert resumed.status == "succeeded", (resumed.failed, resumed.halt)
    assert second.burst_answers == 8
    assert ticker_states(sqlite_engine, stopped.batch_id) == dict.fromkeys(
        TICKERS, ("succeeded", None))
    assert_rows_match_the_servers(sqlite_engine, stopped.batch_id, [first, second])
