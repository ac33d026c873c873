"""429 and 503 bursts of 1 to 30 answers at the start, middle and end of a night, on SQLite:
every ticker succeeds, or the batch stops resumable and one `run --resume` finishes it;
``llm_calls`` equals the fake server's request log (the scenarios: bursts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from agents.data.demo import DEMO_AS_OF, write_demo
from tests.unit.support.bursts import (
    PAST_THE_BUDGET,
    WAITED_OUT,
    Burst,
    past_the_budget,
    waited_out,
)


@pytest.fixture
def demo_dir(tmp_path: Path) -> Path:
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    return tmp_path / "data"


@pytest.mark.parametrize("burst", WAITED_OUT, ids=str)
async def test_a_burst_within_the_budget_is_waited_out_and_every_ticker_succeeds(
        sqlite_engine: Engine, demo_dir: Path, burst: Burst) -> None:
    await waited_out(sqlite_engine, demo_dir, burst)


@pytest.mark.parametrize("burst", PAST_THE_BUDGET, ids=str)
def test_a_burst_past_the_budget_stops_the_night_resumable_and_one_resume_ends_it(
        sqlite_engine: Engine, demo_dir: Path, burst: Burst,
        monkeypatch: pytest.MonkeyPatch) -> None:
    past_the_budget(sqlite_engine, demo_dir, burst, monkeypatch)
