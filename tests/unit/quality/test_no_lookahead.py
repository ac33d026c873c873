"""Check that no prompt sees a price after the as-of date, though the snapshot holds them.

Forward returns need prices after the as-of date in the same snapshot; the pipeline must
never read them. Three checks on real batches against the fake server: the demo snapshot
really has forward rows, every date in every prompt is on or before the as-of date,
planted canary values in the forward rows never reach a prompt, and the prompts are the
same byte for byte whether or not the snapshot holds any row after the as-of date.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine

from agents.data.demo import DEMO_AS_OF, FORWARD_DAYS, DemoProvider, demo_tickers, write_demo
from agents.data.snapshot import PRICES, SnapshotProvider, read_prices, ticker_dir
from agents.graph import node_names
from app.batch.engine import BatchPlan
from app.config import load_settings
from tests.fakevllm import ChatRequest, FakeServer
from tests.unit.support.engines import make_engine

TICKERS = demo_tickers(2)
CANARY_CLOSE, CANARY_HIGH = 7777.77, 8888.88
DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")


def same_reply(chat: ChatRequest) -> str | None:
    """Answer by (node, ticker, sample) only, so reruns of the graph get identical prompts."""
    if chat.structured:
        return None
    return f"[{chat.node} on {chat.ticker}, sample {chat.sample}] the evidence is mixed."


async def prompts_of(engine: Engine, data_dir: Path) -> list[str]:
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    server = FakeServer(same_reply, nodes=node_names(settings.pipeline()), tickers=TICKERS)
    runner = make_engine(engine, data_dir, server, settings)
    outcome = await runner.run(BatchPlan("nightly", DEMO_AS_OF, TICKERS))
    assert outcome.status == "succeeded" and not outcome.failed
    return sorted("\n".join(m["content"] for m in chat.messages) for chat in server.chats)


def rewrite_prices(data_dir: Path, ticker: str, keep_forward: bool, canary: bool) -> None:
    path = ticker_dir(data_dir, DEMO_AS_OF, ticker) / PRICES
    frame = read_prices(path, ticker)
    after = frame.index > pd.Timestamp(DEMO_AS_OF)
    if canary:
        frame.loc[after, "close"] = CANARY_CLOSE
        frame.loc[after, "high"] = CANARY_HIGH
    frame = frame if keep_forward else frame[~after]
    table = frame.copy()
    table.index = table.index.strftime("%Y-%m-%d")
    table.index.name = "date"
    table["volume"] = table["volume"].round().astype("int64")
    table.to_csv(path, lineterminator="\n")


def test_the_demo_snapshot_runs_past_its_as_of_date(tmp_path: Path) -> None:
    write_demo(tmp_path, DEMO_AS_OF, 2)
    provider = SnapshotProvider(tmp_path)
    for ticker in TICKERS:
        assert len(provider.forward_prices(ticker, DEMO_AS_OF, 500)) == FORWARD_DAYS
        assert provider.load(ticker, DEMO_AS_OF).prices.index.max() <= pd.Timestamp(DEMO_AS_OF)
        bundle = DemoProvider().load(ticker, DEMO_AS_OF)
        assert bundle.prices.index.max() <= pd.Timestamp(DEMO_AS_OF)
        assert bundle.indicators.index.max() <= pd.Timestamp(DEMO_AS_OF)


@pytest.fixture
def snapshots(tmp_path: Path) -> tuple[Path, Path]:
    with_future, without = tmp_path / "with", tmp_path / "without"
    for folder in (with_future, without):
        write_demo(folder, DEMO_AS_OF, 2)
    for ticker in TICKERS:
        rewrite_prices(with_future, ticker, keep_forward=True, canary=True)
        rewrite_prices(without, ticker, keep_forward=False, canary=False)
    return with_future, without


async def test_no_prompt_holds_a_price_or_date_after_the_as_of_date(
        sqlite_engine: Engine, snapshots: tuple[Path, Path]) -> None:
    with_future, without = snapshots
    assert SnapshotProvider(with_future).forward_prices(TICKERS[0], DEMO_AS_OF, 5)[
        "close"].eq(CANARY_CLOSE).all()
    seen = await prompts_of(sqlite_engine, with_future)
    assert len(seen) == len(TICKERS) * len(node_names(load_settings().pipeline()))
    text = "\n".join(seen)
    assert f"{CANARY_CLOSE:.2f}" not in text and f"{CANARY_HIGH:.2f}" not in text
    dates = set(DATE.findall(text))
    assert DEMO_AS_OF.isoformat() in dates  # the check below looks at real dates
    assert max(dates) == DEMO_AS_OF.isoformat()
    # Forward rows present or absent: the pipeline's prompts are the same, byte for byte.
    assert await prompts_of(sqlite_engine, without) == seen
