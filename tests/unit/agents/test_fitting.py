"""Shrink prompts that do not fit the server's context; fail only what cannot fit at all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.decision import reask
from agents.fitting import (
    DEBATE_TURN,
    NEWS_ITEM,
    REJECTED_REPLY,
    SOCIAL_POST,
    PromptSize,
    Trim,
    droppable,
    fit,
)
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.db.models import LLMCall, TickerRun
from tests.fakevllm import (
    CONTEXT_LENGTH_MESSAGE,
    ChatRequest,
    FakeServer,
    Reply,
    prompt_token_count,
)
from tests.unit.support.engines import make_engine

NODES = node_names(load_settings().pipeline())
BUDGET = 64  # every node's max_tokens in these tests
# Long, fixed debate turns: each ~1,000 fake tokens, the same in every run.
LONG = {node: f"{node} argues: " + f"point of {node}. " * 250
        for node in ("bull_r1", "bear_r1", "bull_r2", "bear_r2")}


class CountingSizer:
    """Count 'tokens' as one per character of every message, against a fixed limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.asked: list[int] = []

    async def measure(self, messages: list[dict[str, str]], *, max_tokens: int,
                      exact: bool = False) -> PromptSize | None:
        tokens = sum(len(m["content"]) for m in messages)
        self.asked.append(tokens)
        return PromptSize(tokens, self.limit - max_tokens)


def sections(units: list[str]) -> Any:
    """Render one message from units named by kind; each unit is 10 characters."""
    def render(k: int) -> list[dict[str, str]]:
        kept = [f"{u[:9]:<9}|" for u in units[k:]]
        return [{"role": "user", "content": "BASE" * 5 + "".join(kept)}]  # 20 + 10 per unit
    return render


async def test_fit_leaves_out_turns_then_news_then_posts_and_no_more_than_needed() -> None:
    units = droppable(turns=3, news=2, social=2)
    assert units == [DEBATE_TURN] * 3 + [NEWS_ITEM] * 2 + [SOCIAL_POST] * 2
    # 20 + 70 = 90 characters in full; a limit of 55 less 5 of output leaves 50: 3 units.
    messages, trim = await fit(CountingSizer(55).measure, sections(units), units, max_tokens=5)
    assert messages[0]["content"].count("|") == 3
    assert trim == Trim(((DEBATE_TURN, 3), (NEWS_ITEM, 1)), 40)
    assert trim.describe() == "3 debate turns, 1 news item"


async def test_fit_sends_a_prompt_that_fits_untouched_and_counts_it_once() -> None:
    sizer = CountingSizer(1000)
    units = droppable(turns=2)
    messages, trim = await fit(sizer.measure, sections(units), units, max_tokens=5)
    assert trim is None and messages == sections(units)(0) and len(sizer.asked) == 1


async def test_fit_returns_the_smallest_prompt_when_nothing_is_enough() -> None:
    units = droppable(news=4)
    messages, trim = await fit(CountingSizer(10).measure, sections(units), units, max_tokens=5)
    assert messages == sections(units)(4)  # all left out; still too long for the client
    assert trim is not None and trim.dropped == ((NEWS_ITEM, 4),) and trim.tokens == 40


def debate_script(chat: ChatRequest) -> Reply | str | None:
    # No arrival index in any reply: the analysts race, and what a later node is sent must be
    # the same in both runs whatever order they reached the server in.
    if chat.node in LONG or chat.structured:
        return LONG.get(chat.node or "")
    return f"[{chat.node} on {chat.ticker}] Fake analysis: the evidence is mixed."


def make(db: Engine, data: Path, server: FakeServer, max_model_len: int) -> BatchEngine:
    server.max_model_len = max_model_len
    settings = load_settings(retry_backoff_s=0, node_max_tokens={
        group: BUDGET for group in ("analyst", "researcher", "research_manager", "trader",
                                    "risk", "portfolio_manager")})
    return make_engine(db, data, server, settings)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    return tmp_path / "data"


async def test_an_over_long_prompt_is_shrunk_and_its_call_succeeds(
        sqlite_engine: Engine, data: Path) -> None:
    ticker = demo_tickers(1)[0]
    # Run 1, room for everything: each node's full prompt size, by the fake's own count.
    roomy = FakeServer(debate_script, nodes=NODES, tickers=[ticker])
    first = await make(sqlite_engine, data, roomy, 100_000).run(
        BatchPlan("nightly", DEMO_AS_OF, [ticker]))
    assert first.status == "succeeded"
    full = {c.node: prompt_token_count(c.messages) for c in roomy.served()}
    # Run 2: one token short for bull_r2's full prompt plus its output budget.
    limit = full["bull_r2"] + BUDGET - 1
    tight = FakeServer(debate_script, nodes=NODES, tickers=[ticker])
    second = await make(sqlite_engine, data, tight, limit).run(
        BatchPlan("nightly", DEMO_AS_OF, [ticker]))
    assert second.status == "succeeded", second.failed
    sent = {c.node: c for c in tight.served()}
    assert set(sent) == set(NODES)
    with sqlite_engine.connect() as conn:
        rows = {r.node: r for r in conn.execute(
            select(LLMCall.node, LLMCall.status, LLMCall.context_trimmed_tokens,
                   LLMCall.context_trimmed).where(LLMCall.batch_id == second.batch_id))}
    shrunk = []
    for node in NODES:
        size = prompt_token_count(sent[node].messages)
        assert size + BUDGET <= limit, node  # everything sent fits
        if full[node] + BUDGET > limit:
            shrunk.append(node)
            assert rows[node].context_trimmed_tokens == full[node] - size, node
            assert rows[node].context_trimmed.endswith(("debate turn", "debate turns")), node
        else:
            assert rows[node].context_trimmed_tokens is None, node
            assert sent[node].messages == next(
                c.messages for c in roomy.served() if c.node == node), node
    assert "bull_r2" in shrunk and "market" not in shrunk
    # bull_r2 had two turns; leaving out the oldest (bull_r1's) was enough.
    assert rows["bull_r2"].context_trimmed == "1 debate turn"
    assert LONG["bear_r1"].strip() in sent["bull_r2"].user
    assert LONG["bull_r1"].strip() not in sent["bull_r2"].user
    assert "1 earlier turn left out to fit the model's context" in sent["bull_r2"].user


async def test_a_prompt_that_cannot_fit_fails_only_its_ticker_as_context_length(
        sqlite_engine: Engine, data: Path) -> None:
    tickers = demo_tickers(2)
    heavy = tickers[0]
    facts_file = data / DEMO_AS_OF.isoformat() / heavy / "fundamentals.json"
    facts = json.loads(facts_file.read_text())
    # Figures are never left out: 3,000 extra ones make its fundamentals prompt too long.
    facts.update({f"segment_{i:04d}_revenue": 1_000_000 + i for i in range(3000)})
    facts_file.write_text(json.dumps(facts))
    server = FakeServer(nodes=NODES, tickers=tickers)
    outcome = await make(sqlite_engine, data, server, 8192).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.succeeded == [tickers[1]]
    assert list(outcome.failed) == [heavy] and "max-model-len" in outcome.failed[heavy]
    with sqlite_engine.connect() as conn:
        row = conn.execute(select(LLMCall.error_class, LLMCall.http_status)
                           .where(LLMCall.ticker == heavy, LLMCall.node == "fundamentals")
                           ).one()
        status = dict(conn.execute(select(TickerRun.ticker, TickerRun.status)).all())
    assert tuple(row) == ("context_length", None)  # refused before it was sent
    assert status == {heavy: "failed", tickers[1]: "succeeded"}
    assert not [c for c in server.chats if c.ticker == heavy and c.node == "fundamentals"]


# Risk turns as long as the debate's: the portfolio manager's prompt holds six of them.
RISK_LONG = {node: f"{node} warns: " + f"risk of {node}. " * 250
             for node in ("aggressive_r1", "conservative_r1", "neutral_r1", "aggressive_r2",
                          "conservative_r2", "neutral_r2")}
REJECTED = "Rating: Buy, I think."  # not JSON: the decision is asked again


def vllm_024(server: FakeServer, rejected: list[ChatRequest]) -> Any:
    """Script a server that refuses prompt + max_tokens over max-model-len with HTTP 400, as
    vLLM 0.24 does, and whose portfolio manager answers the first time with no decision."""

    def script(chat: ChatRequest) -> Reply | str | None:
        if prompt_token_count(chat.messages) + (chat.max_tokens or 0) > server.max_model_len:
            return Reply(status=400, error=CONTEXT_LENGTH_MESSAGE)
        if chat.node == "portfolio_manager" and not rejected:
            rejected.append(chat)
            return REJECTED
        return LONG.get(chat.node or "") or RISK_LONG.get(chat.node or "")

    return script


async def test_a_reask_on_a_prompt_trimmed_to_the_limit_is_trimmed_again_and_succeeds(
        sqlite_engine: Engine, data: Path) -> None:
    ticker = demo_tickers(1)[0]

    async def night(max_model_len: int) -> tuple[FakeServer, Any, list[ChatRequest]]:
        rejected: list[ChatRequest] = []
        server = FakeServer(nodes=NODES, tickers=[ticker])
        server.script = vllm_024(server, rejected)
        outcome = await make(sqlite_engine, data, server, max_model_len).run(
            BatchPlan("nightly", DEMO_AS_OF, [ticker]))
        return server, outcome, rejected

    # Room for everything, then one token short of the manager's whole first prompt: the
    # guard leaves out its oldest turn, and that prompt's size is what the limit is set to.
    _, roomy, rejected = await night(100_000)
    assert roomy.status == "succeeded"
    whole = prompt_token_count(rejected[0].messages)
    _, short, rejected = await night(whole + BUDGET - 1)
    assert short.status == "succeeded"
    fitted = prompt_token_count(rejected[0].messages)
    assert fitted < whole

    # The limit now is exactly the fitted first prompt plus its output budget: the rejected
    # reply and the correction appended to it cannot fit unless the re-ask is fitted too.
    limit = fitted + BUDGET
    server, outcome, rejected = await night(limit)
    assert outcome.status == "succeeded", outcome.failed
    asks = [c for c in server.chats if c.node == "portfolio_manager"]
    assert len(asks) == 2 and asks[0] is rejected[0]
    assert prompt_token_count(asks[0].messages) + BUDGET == limit  # trimmed to the limit
    reask = asks[1]
    assert [m["role"] for m in reask.messages[-2:]] == ["assistant", "user"]
    assert reask.messages[-2]["content"] == REJECTED
    assert "not a valid decision" in reask.messages[-1]["content"]
    # Nothing the server was sent overflowed its context, and it refused nothing.
    assert all(prompt_token_count(c.messages) + BUDGET <= limit for c in server.chats)
    assert all(c.served is not None and c.served.status == 200 for c in server.chats)
    with sqlite_engine.connect() as conn:
        rows = conn.execute(
            select(LLMCall.call_id, LLMCall.attempt, LLMCall.status, LLMCall.context_trimmed,
                   LLMCall.context_trimmed_tokens)
            .where(LLMCall.batch_id == outcome.batch_id, LLMCall.node == "portfolio_manager")
            .order_by(LLMCall.id)).all()
    # The re-ask is a call of its own: each answered at its first attempt.
    assert [(r.attempt, r.status) for r in rows] == [(1, "ok"), (1, "ok")]
    assert rows[0].call_id != rows[1].call_id
    assert rows[0].context_trimmed == "1 debate turn"
    # The re-ask left out more than the first call did, and its row says so.
    assert rows[1].context_trimmed == "2 debate turns"
    assert rows[1].context_trimmed_tokens > 0


async def test_a_reask_leaves_out_its_rejected_reply_only_after_every_other_unit() -> None:
    units = droppable(turns=2)
    asked = reask(sections(units), len(units), "R" * 30, "the score is out of range")
    correction = asked(0)[-1]
    assert correction["role"] == "user" and "the score is out of range" in correction["content"]
    base = 20 + len(correction["content"])  # the prompt with nothing droppable, + correction
    # Room for the reply but no turn: both turns go, the reply stays.
    messages, trim = await fit(CountingSizer(base + 30 + 5).measure, asked,
                               [*units, REJECTED_REPLY], max_tokens=5)
    assert trim is not None and trim.dropped == ((DEBATE_TURN, 2),)
    assert messages[-2] == {"role": "assistant", "content": "R" * 30}
    # No room for it either: the reply goes too, the correction never does.
    messages, trim = await fit(CountingSizer(base + 5).measure, asked, [*units, REJECTED_REPLY],
                               max_tokens=5)
    assert trim is not None and trim.describe() == "2 debate turns, 1 rejected reply"
    assert [m["role"] for m in messages] == ["user", "user"] and messages[-1] == correction
