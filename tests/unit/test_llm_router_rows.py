"""Each usage row names where its call went: the router, and the server behind it where the
router says which one answered (the response header ``llm_server_header``)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, select

from agents.chat import CallTag
from agents.fitting import fixed
from app.config import load_settings
from app.db.models import LLMCall
from app.errors import ConfigError
from app.llm import TrackedLLM
from app.usage import UsageRecorder
from tests.fakevllm import FakeServer, Reply
from tests.fakevllm.router import FakeRouter
from tests.unit.support.call_rows import new_batch

MESSAGES = [{"role": "user", "content": "AAPL?"}]
TICKERS = ("AAPL", "MSFT", "NVDA", "AMZN", "GOOG", "META")


def fleet(**router: object) -> FakeRouter:
    return FakeRouter({"http://gpu0.test:8000": FakeServer(),
                       "http://gpu1.test:8000": FakeServer()},
                      **router)  # type: ignore[arg-type]


async def rows_through(router: FakeRouter, engine: Engine, **settings: Any) -> list[Any]:
    """Send one call per ticker through ``router``; return their rows and who answered."""
    batch_id = new_batch(engine)
    config = load_settings(llm_base_url=router.base_url, check_context_length=False,
                           retry_backoff_s=0, **settings)
    async with router.client() as http, UsageRecorder(engine, flush_interval_s=0.01) as rec:
        llm = TrackedLLM(config, rec, http_client=http)
        for ticker in TICKERS:
            await llm.chat(CallTag(batch_id, ticker, "analyst"), fixed(MESSAGES), max_tokens=50)
    with engine.connect() as conn:
        return list(conn.execute(select(LLMCall.ticker, LLMCall.endpoint, LLMCall.served_by,
                                        LLMCall.status)
                                 .where(LLMCall.batch_id == batch_id)).all())


def answered_by(router: FakeRouter) -> dict[str, str]:
    """Return each ticker's server root, from what each fake server itself was sent."""
    return {r.body["user"].removeprefix("nightdesk:"): root
            for root, fake in router.servers.items() for r in fake.requests
            if r.path == "/v1/chat/completions"}


async def test_a_row_names_the_server_the_router_says_answered(sqlite_engine: Engine) -> None:
    router = fleet(names_server="X-Served-By")
    rows = await rows_through(router, sqlite_engine, llm_server_header="x-served-by")
    served = answered_by(router)
    assert set(served.values()) == set(router.servers)  # both servers answered some
    assert {r.ticker: r.served_by for r in rows} == served
    assert {r.endpoint for r in rows} == {router.base_url}


async def test_behind_a_router_that_names_none_a_row_names_the_router(
        sqlite_engine: Engine) -> None:
    # vllm-router 0.1.17 sends no such header: the header asked for is not there.
    rows = await rows_through(fleet(), sqlite_engine, llm_server_header="X-Served-By")
    assert len(rows) == len(TICKERS)
    assert {(r.endpoint, r.served_by) for r in rows} == {("http://router.test/v1", None)}


async def test_a_header_not_asked_for_is_not_read(sqlite_engine: Engine) -> None:
    rows = await rows_through(fleet(names_server="X-Served-By"), sqlite_engine)
    assert {r.served_by for r in rows} == {None}


async def test_a_refusal_names_the_server_that_refused(sqlite_engine: Engine) -> None:
    # A server's own error passes through the router with the router's header on it.
    router = FakeRouter({"http://gpu0.test:8000": FakeServer(lambda chat: Reply(status=400))},
                        names_server="X-Served-By")
    batch_id = new_batch(sqlite_engine)
    config = load_settings(llm_base_url=router.base_url, check_context_length=False,
                           llm_server_header="X-Served-By")
    async with router.client() as http, UsageRecorder(sqlite_engine) as rec:
        with pytest.raises(Exception, match="HTTP 400"):
            await TrackedLLM(config, rec, http_client=http).chat(
                CallTag(batch_id, "AAPL", "analyst"), fixed(MESSAGES), max_tokens=50)
    with sqlite_engine.connect() as conn:
        row = conn.execute(select(LLMCall.status, LLMCall.served_by)).one()
    assert tuple(row) == ("error", "http://gpu0.test:8000")


def test_a_header_name_with_a_space_is_one_clear_error() -> None:
    with pytest.raises(ConfigError,
                       match="NIGHTDESK_LLM_SERVER_HEADER: must be an HTTP header name"):
        load_settings(llm_server_header="X Served By")
