"""The router itself gone mid-night (a restart: systemd's RestartSec=5s in
deploy/nightdesk-router.service) while the servers behind it run on: the endpoint reads as
down, the calls wait for it as for a server restarting, and no ticker fails for it
(docs/lab/2026-12-07-fleet-outside.md). Before, the servers' own /metrics still answered,
so the readings said the endpoint was up and every call cut by the restart failed its ticker.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import Engine

from agents.data.demo import DEMO_AS_OF
from agents.data.snapshot import SnapshotProvider
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.runs.checkpoints import Checkpoints
from tests.fakevllm import ChatRequest, FakeServer
from tests.fakevllm.router import FakeRouter
from tests.unit.support.bursts import TICKERS
from tests.unit.support.fault_night import NODES, QUICK, ticker_states

GONE_S = 0.5  # the router's time away: many times the client's retries (QUICK backoff)


def test_a_router_restarted_mid_night_costs_no_ticker(sqlite_engine: Engine,
                                                      demo_dir: Path) -> None:
    async def script(chat: ChatRequest) -> None:
        # At the first debate call the router goes away, the call it carried answered.
        if chat.node == "bear_r1" and not router.down and not gone:
            gone.append(chat)
            router.down = True
            asyncio.get_running_loop().call_later(GONE_S, setattr, router, "down", False)

    gone: list[ChatRequest] = []
    router = FakeRouter({f"http://gpu{i}.test:8000": FakeServer(script, nodes=NODES,
                                                                 tickers=TICKERS)
                         for i in range(2)})
    settings = load_settings(**{**QUICK, "llm_base_url": router.base_url,
                                "metrics_interval_s": 0.05, "max_attempts": 2,
                                "outage_budget_s": 30})
    runner = BatchEngine(settings, sqlite_engine, http_client=router.client(),
                         provider=SnapshotProvider(demo_dir), sample_metrics=True,
                         checkpoints=Checkpoints(settings.store.database_url, sqlite_engine))
    outcome = asyncio.run(runner.run(BatchPlan("nightly", DEMO_AS_OF, TICKERS)))
    assert gone, "the router never went away"
    assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
    assert ticker_states(sqlite_engine, outcome.batch_id) == dict.fromkeys(
        TICKERS, ("succeeded", None))
