"""A proxy or load balancer in front of vLLM answering HTTP 200 with a body of its own (an
HTML page, JSON with no choices, JSON cut short) in place of the server's, on the chat
route, ``/tokenize``, ``/metrics`` and the preflight's ``/v1/models``: a server fault,
tried again within its budget; never a crash, a wrong rating, or tokens counted
(docs/lab/2026-12-07-faults-outside-3.md)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from agents.data.demo import DEMO_AS_OF
from app.batch.engine import BatchPlan
from app.db.models import Decision, LLMCall
from serving.preflight import check_endpoint
from tests.fakevllm import BASE_URL, ChatRequest, FakeServer, Reply
from tests.unit.support.bursts import TICKERS
from tests.unit.support.fault_night import (
    NODES,
    assert_rows_match_the_servers,
    night_engine,
    ticker_states,
)

HTML = ("<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n"
        "<body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body>"
        "</html>\n")
PAGES: dict[str, tuple[str, str]] = {
    "html": (HTML, "text/html"),
    "json-without-choices": ('{"object": "error", "message": "upstream timed out"}',
                             "application/json"),
    "json-cut-short": ('{"id": "chatcmpl-1", "object": "chat.completion", "choices": '
                       '[{"index": 0, "message": {"content": "{\\"rating\\": \\"Sell',
                       "application/json"),
    "event-without-choices": ('data: {"id": "chatcmpl-1", "object": "chat.completion.chunk"}'
                              '\n\ndata: [DONE]\n\n', "text/event-stream"),
}
MOMENTS: dict[str, Callable[[ChatRequest], bool]] = {
    "analyst": lambda chat: chat.index == 0,
    "debate": lambda chat: chat.node == "bear_r1" and chat.attempt == 1,
    "rating": lambda chat: (chat.ticker, chat.node, chat.attempt)
    == (TICKERS[-1], "portfolio_manager", 1),
}


def paged(where: Callable[[ChatRequest], bool], page: tuple[str, str], times: int = 1
          ) -> Callable[[ChatRequest], Any]:
    """Answer the request ``where`` picks (and the next ``times - 1`` tries) with ``page``."""
    left = [times]

    def script(chat: ChatRequest) -> Reply | None:
        if left[0] and (where(chat) or left[0] < times):
            left[0] -= 1
            return Reply(page=page[0], page_type=page[1])
        return None
    return script


def assert_whole_night(db: Engine, outcome: Any, server: FakeServer) -> None:
    assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
    assert ticker_states(db, outcome.batch_id) == dict.fromkeys(TICKERS, ("succeeded", None))
    assert_rows_match_the_servers(db, outcome.batch_id, [server])
    with db.connect() as conn:
        decisions = Counter(conn.execute(select(Decision.ticker, Decision.sample)).all())
        # A page is no answer: its row counts no token.
        paged_tokens = conn.execute(select(func.count()).select_from(LLMCall).where(
            LLMCall.status == "error", (LLMCall.prompt_tokens.is_not(None))
            | (LLMCall.completion_tokens.is_not(None)))).scalar_one()
    assert set(decisions.values()) == {1} and len(decisions) == len(TICKERS)
    assert paged_tokens == 0


@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("page", list(PAGES))
def test_a_proxy_page_for_a_chat_answer_is_tried_again_and_costs_nothing(
        sqlite_engine: Engine, demo_dir: Path, page: str, moment: str) -> None:
    server = FakeServer(paged(MOMENTS[moment], PAGES[page], times=2), nodes=NODES,
                        tickers=TICKERS)
    outcome = asyncio.run(night_engine(sqlite_engine, demo_dir, server).run(
        BatchPlan("nightly", DEMO_AS_OF, TICKERS)))
    assert sum(1 for c in server.chats if c.served and c.served.page) == 2
    assert_whole_night(sqlite_engine, outcome, server)


@pytest.mark.parametrize("page", ["html", "json-without-choices", "json-cut-short"])
def test_proxy_pages_on_tokenize_are_no_chat_attempt_and_cost_no_ticker(
        sqlite_engine: Engine, demo_dir: Path, page: str) -> None:
    server = FakeServer(nodes=NODES, tickers=TICKERS)
    body, kind = PAGES[page]
    server.cue(Reply(page=body, page_type=kind), times=40, path="/tokenize")
    outcome = asyncio.run(night_engine(sqlite_engine, demo_dir, server,
                                       check_context_length=True).run(
        BatchPlan("nightly", DEMO_AS_OF, TICKERS)))
    assert server.tokenize_calls > 40
    assert_whole_night(sqlite_engine, outcome, server)


def test_proxy_pages_on_metrics_pause_admission_and_cost_no_ticker(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    server = FakeServer(nodes=NODES, tickers=TICKERS)
    server.cue(Reply(page=HTML), times=6, path="/metrics")
    engine = night_engine(sqlite_engine, demo_dir, server)
    engine.sample_metrics = True
    outcome = asyncio.run(engine.run(BatchPlan("nightly", DEMO_AS_OF, TICKERS)))
    assert sum(1 for r in server.requests if r.path == "/metrics") > 6
    assert_whole_night(sqlite_engine, outcome, server)


@pytest.mark.parametrize("page", ["html", "json-without-choices", "json-cut-short"])
def test_a_proxy_page_for_the_model_list_is_named_as_the_proxys_not_a_wrong_url(
        page: str) -> None:
    server = FakeServer(model="m")
    body, kind = PAGES[page]
    server.cue(Reply(page=body, page_type=kind), path="/v1/models")
    check = check_endpoint(BASE_URL, "m", client=server.sync_client())
    assert check.level == "fail" and "model list" in check.detail, check
