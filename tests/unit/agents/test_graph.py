"""Run the whole per-ticker graph against the fake server, through the real tracked client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import Engine, select

from agents.data.base import MarketBundle, NewsItem, SocialPost
from agents.graph import TickerResult, analyze_ticker, finished, kind_of, node_names
from app.config import Settings
from app.db.engine import session_scope
from app.db.models import Batch, LLMCall
from app.errors import CheckpointError, DecisionError, LLMHTTPError
from app.llm import TrackedLLM
from app.traffic.client import TickerClient
from app.traffic.server import Server, ServerSet
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from app.usage import UsageRecorder
from tests.fakevllm import DEFAULT_DECISION, ChatRequest, FakeServer, Reply

AS_OF = date(2024, 6, 28)
ANALYSTS = ["market", "sentiment", "news", "fundamentals"]
DEFAULT_NODES = [
    *ANALYSTS,
    "bull_r1", "bear_r1", "bull_r2", "bear_r2",
    "research_manager", "trader",
    "aggressive_r1", "conservative_r1", "neutral_r1",
    "aggressive_r2", "conservative_r2", "neutral_r2",
    "portfolio_manager",
]


def make_bundle(ticker: str = "ACME") -> MarketBundle:
    """Build a small, fixed bundle: 30 sessions, two indicators, a few news and posts."""
    days = pd.bdate_range(end=AS_OF, periods=30)
    close = [100 + i * 0.5 for i in range(30)]
    prices = pd.DataFrame({"open": close, "high": [c + 1 for c in close],
                           "low": [c - 1 for c in close], "close": close,
                           "volume": [1_000_000 + i for i in range(30)]}, index=days)
    indicators = pd.DataFrame({"close_10_sma": close, "rsi_14": [55.0] * 30}, index=days)
    return MarketBundle(
        ticker=ticker, as_of=AS_OF, prices=prices, indicators=indicators,
        fundamentals={"name": "Acme Corp", "pe_ratio": 18.5, "net_margin": 0.12},
        news=[NewsItem(AS_OF - timedelta(days=1), "Wire", "Acme beats estimates")],
        social=[SocialPost(AS_OF, "trader1", "Acme looks strong", likes=3)],
        demo=True, source="demo",
    )


@dataclass
class Harness:
    engine: Engine
    batch_id: int
    url: str


@pytest.fixture
def harness(sqlite_url: str, sqlite_engine: Engine) -> Harness:
    with session_scope(sqlite_engine) as session:
        batch = Batch(kind="nightly", as_of=AS_OF, created_at=datetime.now(UTC), settings={})
        session.add(batch)
        session.flush()
        batch_id = batch.id
    return Harness(sqlite_engine, batch_id, sqlite_url)


def settings_for(h: Harness, **overrides: object) -> Settings:
    return Settings(database_url=h.url, llm_base_url="http://fake.test/v1", retry_backoff_s=0,
                    **overrides)  # type: ignore[arg-type]


async def run(h: Harness, settings: Settings, server: FakeServer, **kwargs: object,
              ) -> TickerResult:
    async with UsageRecorder(h.engine) as recorder:
        llm = TrackedLLM(settings, recorder, http_client=server.client())
        return await analyze_ticker(llm=llm, config=settings.pipeline(), batch_id=h.batch_id,
                                    bundle=make_bundle(), **kwargs)  # type: ignore[arg-type]


def rows(h: Harness) -> list[LLMCall]:
    with session_scope(h.engine) as session:
        return list(session.scalars(select(LLMCall).order_by(LLMCall.id)))


def common_prefix(texts: list[str]) -> str:
    """Return the longest string every text starts with (character-wise, not paths)."""
    first, last = min(texts), max(texts)
    size = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b),
                min(len(first), len(last)))
    return first[:size]


def test_node_names_default_and_counts() -> None:
    assert node_names(Settings().pipeline()) == DEFAULT_NODES
    for debate, risk in [(1, 1), (3, 2), (2, 4)]:
        names = node_names(Settings(debate_rounds=debate, risk_rounds=risk).pipeline())
        assert len(names) == 4 + 2 * debate + 2 + 3 * risk + 1
        assert len(set(names)) == len(names)
    assert kind_of("conservative_r2") == "conservative"
    assert kind_of("research_manager") == "research_manager"


async def test_whole_graph_makes_17_calls_in_order_with_shared_prefix(harness: Harness) -> None:
    settings = settings_for(harness)
    server = FakeServer(nodes=DEFAULT_NODES, tickers=["ACME"])

    result = await run(harness, settings, server)

    chats = server.chats
    assert len(chats) == 17
    order = [c.node for c in chats]
    assert set(order[:4]) == set(ANALYSTS)  # parallel: any order among themselves
    assert order[4:] == DEFAULT_NODES[4:]
    assert result.decision.model_dump() == DEFAULT_DECISION
    assert list(result.outputs) == DEFAULT_NODES

    # One system message for all; every user prompt opens with instrument and as-of.
    assert len({c.system for c in chats}) == 1
    assert all(c.user.startswith("# Instrument: ACME\nAs-of date: 2024-06-28.") for c in chats)
    assert all("DEMO data" in c.user for c in chats)

    # Downstream prompts share a byte-identical prefix holding all four reports, in order.
    downstream = [c.user for c in chats[4:]]
    shared = common_prefix(downstream)
    reports = [result.outputs[k].text for k in ANALYSTS]
    positions = [shared.find(text) for text in reports]
    assert all(p > 0 for p in positions) and positions == sorted(positions)
    assert "Your task" not in shared

    # Structured output only for the decision, with the group's budget everywhere.
    assert [c.structured for c in chats] == [False] * 16 + [True]
    fmt = chats[-1].body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    budgets = settings.agents.node_max_tokens
    assert chats[0].max_tokens == budgets["analyst"]
    assert server.by_node("bear_r2")[0].max_tokens == budgets["researcher"]
    assert server.by_node("neutral_r1")[0].max_tokens == budgets["risk"]
    assert chats[-1].max_tokens == budgets["portfolio_manager"]

    # One llm_calls row per call, whose usage equals what the fake served.
    stored = rows(harness)
    assert sorted(r.node for r in stored) == sorted(DEFAULT_NODES)
    assert {(r.attempt, r.status, r.sample) for r in stored} == {(1, "ok", 0)}
    totals = server.usage_totals()
    assert sum(r.prompt_tokens or 0 for r in stored) == totals["prompt_tokens"]
    assert sum(r.completion_tokens or 0 for r in stored) == totals["completion_tokens"]
    assert sum(r.cached_tokens or 0 for r in stored) == totals["cached_tokens"]
    assert totals["prompt_tokens"] > 0


class Asked:
    """A client in front of another that keeps the name of every method the graph calls."""

    def __init__(self, llm: object) -> None:
        self.llm, self.called = llm, list[str]()

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.llm, name)

        async def called(*args: Any, **kwargs: Any) -> Any:
            self.called.append(name)
            return await method(*args, **kwargs)
        return called


async def test_a_node_calls_the_batchs_client_once_per_request(harness: Harness) -> None:
    # Issue 45: a node asked its ticker's client twice for each request, to measure the
    # prompt, then to chat. The client fits the prompt as part of the call now: one call of
    # the client for each chat request the server sees, its prompt counted all the same
    # (agents/test_fitting.py trims prompts through a batch's client).
    settings = settings_for(harness)
    server = FakeServer(nodes=DEFAULT_NODES, tickers=["ACME"])
    async with UsageRecorder(harness.engine) as recorder:
        llm = TrackedLLM(settings, recorder, http_client=server.client())
        changed = asyncio.Event()
        servers = ServerSet([Server(0, settings.llm.url, llm, Strategy.parse("fixed-4"),
                                    changed=changed, counter=llm)], changed)
        client = Asked(TickerClient(servers, servers.first, Ticket(0, requests=17)))
        await analyze_ticker(llm=client, config=settings.pipeline(),  # type: ignore[arg-type]
                             batch_id=harness.batch_id, bundle=make_bundle())
    assert len(server.chats) == 17 and client.called == ["chat"] * 17
    assert server.tokenize_calls > 0


async def test_debate_history_reaches_the_next_speaker(harness: Harness) -> None:
    server = FakeServer(lambda c: None if c.structured else f"{c.node} says {c.index}",
                        nodes=DEFAULT_NODES, tickers=["ACME"])
    await run(harness, settings_for(harness), server)

    bull_r2 = server.by_node("bull_r2")[0].user
    assert "bull_r1 says" in bull_r2 and "bear_r1 says" in bull_r2
    assert "round 2 of 2" in bull_r2
    pm = server.by_node("portfolio_manager")[0].user
    assert "neutral_r2 says" in pm and "research_manager says" in pm and "trader says" in pm


@pytest.mark.parametrize(("debate", "risk", "calls"), [(1, 1, 12), (5, 5, 32)])
async def test_rounds_change_the_call_count(harness: Harness, debate: int, risk: int,
                                            calls: int) -> None:
    settings = settings_for(harness, debate_rounds=debate, risk_rounds=risk)
    names = node_names(settings.pipeline())
    server = FakeServer(nodes=names, tickers=["ACME"])

    result = await run(harness, settings, server)

    # 4 + 2*debate + 2 + 3*risk + 1; 32 calls also outruns LangGraph's default step limit.
    assert len(server.chats) == 4 + 2 * debate + 2 + 3 * risk + 1 == calls
    assert [c.node for c in server.chats][4:] == names[4:]
    assert len(rows(harness)) == calls
    assert list(result.outputs) == names


async def test_analysts_run_in_parallel(harness: Harness) -> None:
    def slow_analysts(chat: ChatRequest) -> Reply | None:
        return Reply(content="report", delay_s=0.05) if chat.node in ANALYSTS else None

    server = FakeServer(slow_analysts, nodes=DEFAULT_NODES, tickers=["ACME"])
    await run(harness, settings_for(harness), server)
    assert server.max_in_flight == 4


async def test_the_sample_reaches_the_request_and_the_graph_sets_no_priority(
        harness: Harness) -> None:
    settings = settings_for(harness, priority_scheduling=True)
    server = FakeServer(nodes=DEFAULT_NODES, tickers=["ACME"])
    result = await run(harness, settings, server, sample=2)

    assert result.sample == 2
    assert all(c.sample == 2 for c in server.chats)  # recognised from the seed
    # A request's priority is the gate's, from the ticker's ticket (app/traffic/gate.py).
    assert all("priority" not in c.body for c in server.chats)
    assert {r.sample for r in rows(harness)} == {2}


async def test_failed_call_propagates_as_exception(harness: Harness) -> None:
    def reject_bear(chat: ChatRequest) -> Reply | None:
        return Reply(status=400, error="bad request") if chat.node == "bear_r1" else None

    server = FakeServer(reject_bear, nodes=DEFAULT_NODES, tickers=["ACME"])
    with pytest.raises(LLMHTTPError):
        await run(harness, settings_for(harness), server)
    assert [c.node for c in server.chats][-1] == "bear_r1"
    assert not server.by_node("portfolio_manager")


async def test_invalid_decision_is_retried_then_raises(harness: Harness) -> None:
    bad = json.dumps({**DEFAULT_DECISION, "rating": "Strong Buy"})
    server = FakeServer(lambda c: bad if c.structured else None,
                        nodes=DEFAULT_NODES, tickers=["ACME"])

    with pytest.raises(DecisionError, match=r"ACME.*3 call\(s\).*rating"):
        await run(harness, settings_for(harness), server)

    pm_calls = server.by_node("portfolio_manager")
    assert len(pm_calls) == 3
    # Each retry keeps the original prompt as its prefix and says what was wrong.
    first = pm_calls[0].messages
    for retry in pm_calls[1:]:
        assert retry.messages[:2] == first
        assert "not a valid decision" in retry.messages[-1]["content"]
    pm_rows = [r for r in rows(harness) if r.node == "portfolio_manager"]
    # Each ask is a call of its own, answered at its first attempt.
    assert [r.attempt for r in pm_rows] == [1, 1, 1] and len({r.call_id for r in pm_rows}) == 3


async def test_decision_attempts_count_the_http_retries_of_every_call(harness: Harness) -> None:
    replies = iter([Reply(status=500), Reply(content="not json"),
                    Reply(content=json.dumps(DEFAULT_DECISION))])

    def script(chat: ChatRequest) -> Reply | None:
        return next(replies) if chat.structured else None

    server = FakeServer(script, nodes=DEFAULT_NODES, tickers=["ACME"])
    result = await run(harness, settings_for(harness), server)

    assert result.decision.rating == "Overweight"
    assert result.outputs["portfolio_manager"].attempts == 3
    pm_rows = [r for r in rows(harness) if r.node == "portfolio_manager"]
    # The first call's 500 and its retry, then the re-ask: a second call.
    assert [(r.attempt, r.status) for r in pm_rows] == [(1, "error"), (2, "ok"), (1, "ok")]
    assert pm_rows[0].call_id == pm_rows[1].call_id != pm_rows[2].call_id


async def test_one_ticker_failing_leaves_the_others_finishing(harness: Harness) -> None:
    settings = settings_for(harness, decision_attempts=2)
    bad = json.dumps({**DEFAULT_DECISION, "score": 3})
    server = FakeServer(lambda c: bad if c.structured and c.ticker == "BAD" else None,
                        nodes=DEFAULT_NODES, tickers=["ACME", "BAD"])

    async with UsageRecorder(harness.engine) as recorder:
        llm = TrackedLLM(settings, recorder, http_client=server.client())
        results = await asyncio.gather(
            *(analyze_ticker(llm=llm, config=settings.pipeline(), batch_id=harness.batch_id,
                             bundle=make_bundle(t)) for t in ("ACME", "BAD")),
            return_exceptions=True)

    good, failed = results
    assert isinstance(good, TickerResult) and good.ticker == "ACME"
    assert isinstance(failed, DecisionError) and "BAD" in str(failed)
    assert "score" in str(failed)
    assert len([c for c in server.chats if c.ticker == "ACME"]) == 17
    assert len([c for c in server.chats if c.ticker == "BAD"]) == 16 + 2


def test_a_stored_run_that_ended_without_its_decision_says_so_instead_of_a_key_error() -> None:
    # A thread with no task left but no decision cannot be continued: one line that says
    # what it lacks and what to do, never KeyError('decision').
    names = node_names(Settings().pipeline())
    outputs = {name: "stored" for name in names if name != "portfolio_manager"}
    with pytest.raises(CheckpointError) as raised:
        finished({"outputs": outputs}, names, "ACME", date(2026, 11, 27), 1)
    assert str(raised.value) == (
        "ACME: the stored run of sample 1 ended without portfolio_manager, decision; it "
        "cannot be continued: `nightdesk rerun ACME` runs the ticker afresh")
