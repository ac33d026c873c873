"""The preflight's smallest prompts: one ticker whose prompts cannot render is left out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.data.snapshot import SnapshotProvider
from agents.smallest import smallest_prompts
from app.config import load_settings


async def test_a_ticker_whose_prompts_do_not_render_is_left_out_not_the_check(
        tmp_path: Path) -> None:
    # A zero close made the price summary divide by zero while the preflight rendered every
    # ticker's prompts: the whole night stopped in a traceback, where at night that ticker's
    # node would have failed it alone.
    write_demo(tmp_path / "data", DEMO_AS_OF, 3)
    provider = SnapshotProvider(tmp_path / "data")
    first, broken, last = (provider.load(t, DEMO_AS_OF) for t in demo_tickers(3))
    broken = dataclasses.replace(broken, prices=broken.prices.assign(close=0.0))
    config = load_settings().pipeline()
    whole = await smallest_prompts(config, [first, last])
    assert await smallest_prompts(config, [first, broken, last]) == whole
    # The chain is rendered from the first ticker whose prompts render.
    chain = await smallest_prompts(config, [broken, first, last])
    assert {p.ticker for p in chain} == {first.ticker, last.ticker}
    assert [p.node for p in chain] == [p.node for p in whole]
