"""Event-loop turns the adaptive scheduler takes to start N tickers (a count, not a timing).

One in-process server (tests/unit/support/servers.py) whose gate already allows 512
requests, as an endpoint's does a few readings into a night; each ticker's job takes one
``asyncio.sleep(0)`` before its first call (a graph to enter), and calls last 5 s. A
callback that re-arms itself with ``call_soon`` counts the loop's turns until every ticker
has begun. The count does not depend on the host's load; each turn's cost does (the fleet
bench measured tens of ms a turn on a loaded 2-core host).
``PYTHONPATH=. .venv/bin/python docs/bench/start-turns.py [TICKERS]``.
"""

import asyncio
import sys
from types import SimpleNamespace
from typing import Any

from agents.chat import CallTag
from app.traffic.client import TickerClient
from app.traffic.scheduler import Job
from app.traffic.strategy import Strategy
from tests.unit.support.servers import over_one_server


class SlowLLM:
    """A call that takes 5 s: no ticker ends while the others start."""

    settings = SimpleNamespace(calls=SimpleNamespace(max_concurrency=1024))

    async def attempt(self, tag: CallTag, call: Any, body: dict[str, Any], **_: Any) -> None:
        await asyncio.sleep(5)


async def main(tickers: int) -> None:
    scheduler = over_one_server(SlowLLM(), Strategy.parse("adaptive:tail=off"))
    scheduler.endpoints.first.gate.set_limit(512)
    turns, begun = 0, 0

    def turn() -> None:
        nonlocal turns
        turns += 1
        if begun < tickers:
            asyncio.get_running_loop().call_soon(turn)

    def job(key: str) -> Job:
        async def run(gated: TickerClient) -> None:
            nonlocal begun
            begun += 1
            await asyncio.sleep(0)
            await gated.send(CallTag(1, key, "n0", 0), {})
        return Job(key, run, requests=1, chain=1)

    asyncio.get_running_loop().call_soon(turn)
    await scheduler.run([job(f"T{i:03d}") for i in range(tickers)])  # a failed job raises
    print(f"{tickers} tickers begun within {turns} event-loop turns")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 500))
