"""Market data is loaded ahead of admission, several tickers at once, never unboundedly."""

from __future__ import annotations

import threading
import time
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agents.data.base import MarketBundle
from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.runs.checkpoints import Checkpoints
from tests.fakevllm import ChatRequest, FakeServer

pytestmark = pytest.mark.demo_tickers(4)  # loads side by side: four, over a limit of two


class SlowProvider:
    """The snapshot provider, made slow: one ticker waits for ``release``, all take ``pause_s``."""

    name = "slow"

    def __init__(self, data_dir: Path, slow: str | None = None, pause_s: float = 0.0) -> None:
        self.inner = SnapshotProvider(data_dir)
        self.slow = slow
        self.pause_s = pause_s
        self.release = threading.Event()
        self.released_in_time = False
        self.loading = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def load(self, ticker: str, as_of: date) -> MarketBundle:
        with self._lock:
            self.loading += 1
            self.most_at_once = max(self.most_at_once, self.loading)
        try:
            if ticker == self.slow:
                # Like yfinance backing off: far longer than the others' whole runs take.
                self.released_in_time = self.release.wait(timeout=10)
            time.sleep(self.pause_s)
            return self.inner.load(ticker, as_of)
        finally:
            with self._lock:
                self.loading -= 1

    def forward_prices(self, ticker: str, as_of: date, days: int) -> object:
        return self.inner.forward_prices(ticker, as_of, days)


async def test_a_slow_load_for_one_ticker_does_not_hold_back_the_others(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(3)
    slow = tickers[0]  # first in line: with no history every ticker weighs the same
    provider = SlowProvider(demo_dir, slow=slow)
    decided: set[str] = set()

    def script(chat: ChatRequest) -> None:
        if chat.node == "portfolio_manager":
            decided.add(str(chat.ticker))
            if decided >= set(tickers) - {slow}:
                provider.release.set()  # the others are through: the slow load may end

    server = FakeServer(script, nodes=node_names(load_settings().pipeline()), tickers=tickers)
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    runner = BatchEngine(settings, sqlite_engine, http_client=server.client(),
                         provider=provider, sample_metrics=False,  # type: ignore[arg-type]
                         checkpoints=Checkpoints(settings.store.database_url, sqlite_engine))
    outcome = await runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert provider.released_in_time  # the others finished while the slow load waited
    assert sorted(outcome.succeeded) == sorted(tickers)
    assert server.chats[0].ticker != slow
    assert outcome.succeeded[-1] == slow


async def test_loads_run_side_by_side_up_to_the_setting(sqlite_engine: Engine,
                                                        demo_dir: Path) -> None:
    tickers = demo_tickers(4)
    provider = SlowProvider(demo_dir, pause_s=0.3)
    server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers)
    settings = load_settings(check_context_length=False, retry_backoff_s=0, data_concurrency=2)
    runner = BatchEngine(settings, sqlite_engine, http_client=server.client(),
                         provider=provider, sample_metrics=False,  # type: ignore[arg-type]
                         checkpoints=Checkpoints(settings.store.database_url, sqlite_engine))
    outcome = await runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert sorted(outcome.succeeded) == sorted(tickers)
    assert provider.most_at_once == 2
