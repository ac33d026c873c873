"""The collector while a batch runs: the heap alive on entry frozen, young passes rarer."""

from __future__ import annotations

import gc
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from agents.data.snapshot import SnapshotProvider
from app.batch.engine import BatchEngine, BatchPlan, TickerWork
from app.batch.heap import YOUNG_THRESHOLD, batch_collector
from app.config import load_settings
from app.traffic.client import TickerClient


def test_objects_alive_on_entry_are_frozen_until_exit() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with batch_collector():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_overlapping_batches_restore_the_thresholds_when_the_last_ends() -> None:
    before = gc.get_threshold()
    first, second = batch_collector(), batch_collector()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
    second.__exit__(None, None, None)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_an_error_inside_still_unfreezes() -> None:
    with pytest.raises(RuntimeError), batch_collector():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


def test_cycles_made_inside_are_still_collected() -> None:
    with batch_collector():
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
