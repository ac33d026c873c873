"""Build the servers a scheduler runs over, for tests that fake one server's client."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from agents.chat import CallTag
from agents.fitting import fixed
from app.config import load_settings
from app.llm import CallStats
from app.promptsize import PromptCounter
from app.traffic.client import TickerClient
from app.traffic.scheduler import Scheduler
from app.traffic.server import Server, ServerSet
from app.traffic.strategy import Strategy
from app.traffic.ticket import Ticket
from tests.fakevllm import DEFAULT_DECISION, ChatRequest, Reply


def one_server(llm: Any, strategy: Strategy, *, gauges: Any = None) -> ServerSet:
    """Return the ServerSet of one Server over ``llm``, read by ``gauges`` (None: unread)."""
    changed = asyncio.Event()
    # A real client counts the budget's first prompts; the in-process models count none.
    server = Server(0, getattr(llm, "base_url", ""), llm, strategy, gauges=gauges,
                    changed=changed, counter=llm if isinstance(llm, PromptCounter) else None)
    if hasattr(gauges, "push"):  # a simulated server that says when it has a reading: the
        gauges.push = server.reading  # test's wiring, standing in for ServerSet.taking's task
    return ServerSet([server], changed)


def over_one_server(llm: Any, strategy: Strategy, *, gauges: Any = None) -> Scheduler:
    """Return a Scheduler over one server: ``one_server(llm, strategy, gauges=gauges)``."""
    return Scheduler(strategy, one_server(llm, strategy, gauges=gauges))


async def ask(servers: ServerSet, batch_id: int, ticker: str, order: int) -> None:
    """Ask ``"<ticker>?"`` (a market call of batch ``batch_id``, 10 tokens at most) through
    the first server's gate, as the ``order``-th ticker."""
    gated = TickerClient(servers, servers.first, Ticket(order))
    await gated.chat(CallTag(batch_id, ticker, "market"),
                     fixed([{"role": "user", "content": f"{ticker}?"}]), max_tokens=10)


class Unread:
    """A test's /metrics reader as a ``Server`` reads it beside its readings (``GaugeSource``):
    read on an interval, no KV cache published, no servers behind it; ``fields`` set more
    (``latest``, ``name``), a subclass its own (the simulated servers' capacity)."""

    interval_s: float | None = 1.0
    kv_capacity: int | None = None
    block_size: int | None = None
    fleet_read: int | None = None

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def read_servers(*gauges: Any, strategy: str = "adaptive") -> ServerSet:
    """Return a ServerSet of one Server per ``gauges`` (a reader's stand-in, with ``name``
    naming its server), or of one unread server; their clients only have settings and call
    totals (what live progress reads), their served model taken as read (``asked``)."""
    changed = asyncio.Event()
    chosen = Strategy.parse(strategy)
    servers = [Server(i, getattr(g, "name", f"http://gpu{i}.test/v1"),
                      SimpleNamespace(settings=load_settings(), stats=CallStats(), asked=True),
                      chosen, gauges=g, changed=changed)  # type: ignore[arg-type]
               for i, g in enumerate(gauges or (None,))]
    return ServerSet(servers, changed)


def nul_script(chat: ChatRequest) -> Reply | None:
    if chat.structured:
        # A JSON escape that decodes to NUL: PostgreSQL text cannot hold it.
        return Reply(json.dumps({**DEFAULT_DECISION, "summary": "Steady\u0000 trend."}))
    if chat.node == "market":
        # A raw NUL, and a lone surrogate (a JSON escape in the stream decodes to one) that
        # psycopg cannot even encode.
        return Reply("Price \x00action\ud800 is firm.", completion_tokens=8)
    return None
