"""Build the servers a scheduler runs over, for tests that fake one server's client."""

from __future__ import annotations

import asyncio
from typing import Any

from app.traffic.scheduler import Scheduler
from app.traffic.server import Server, ServerSet
from app.traffic.strategy import Strategy


def one_server(llm: Any, strategy: Strategy, *, gauges: Any = None) -> ServerSet:
    """Return the ServerSet of one Server over ``llm``, read by ``gauges`` (None: unread)."""
    changed = asyncio.Event()
    server = Server(0, getattr(llm, "base_url", ""), llm, strategy, gauges=gauges,
                    changed=changed)
    return ServerSet([server], changed)


def over_one_server(llm: Any, strategy: Strategy, *, gauges: Any = None) -> Scheduler:
    """Return a Scheduler over one server: ``one_server(llm, strategy, gauges=gauges)``."""
    return Scheduler(strategy, one_server(llm, strategy, gauges=gauges))
