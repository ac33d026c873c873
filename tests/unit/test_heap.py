"""The batch's frozen heap: objects alive on entry leave the collector's reach until exit."""

from __future__ import annotations

import gc
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from agents.data.snapshot import SnapshotProvider
from app.batch.engine import BatchEngine, BatchPlan, TickerWork
from app.batch.heap import frozen_heap
from app.config import load_settings
from app.traffic.client import TickerClient


def test_objects_alive_on_entry_are_frozen_until_exit() -> None:
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_an_error_inside_still_unfreezes() -> None:
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


def test_cycles_made_inside_are_still_collected() -> None:
    with frozen_heap():
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1


async def test_a_batch_runs_with_the_heap_frozen(sqlite_engine: Engine, tmp_path: Path) -> None:
    seen: list[int] = []

    async def work(ticker: str, gated: TickerClient, batch_id: int) -> list[Any]:
        seen.append(gc.get_freeze_count())
        return []

    settings = load_settings(llm_base_url="http://127.0.0.1:9/v1", check_context_length=False)
    runner = BatchEngine(settings, sqlite_engine, provider=SnapshotProvider(tmp_path),
                         sample_metrics=False)
    outcome = await runner.run(BatchPlan("bench", date(2025, 1, 2), ["AAA"], 1, "fixed-4"),
                               TickerWork(work, shapes={"AAA": (1, 1)}))
    assert outcome.status == "succeeded", outcome.failed
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0
