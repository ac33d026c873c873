"""The fault suite's bursts on the real PostgreSQL (the scenarios: tests/unit/faults/bursts.py):
a 429/503 burst within the budget is waited out; one past it stops the night resumable and one
`run --resume` finishes it; ``llm_calls`` equals the fake server's request log."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.data.demo import DEMO_AS_OF, write_demo
from app.db.engine import get_engine, upgrade
from tests.unit.faults.bursts import (
    PAST_THE_BUDGET,
    WAITED_OUT,
    Burst,
    past_the_budget,
    waited_out,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def demo_dir(tmp_path: Path) -> Path:
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    return tmp_path / "data"


# One of each kind and place, so the suite stays short on the shared server.
ON_POSTGRES = [WAITED_OUT[2], WAITED_OUT[4], WAITED_OUT[7]]


@pytest.mark.parametrize("burst", ON_POSTGRES, ids=str)
async def test_a_burst_within_the_budget_is_waited_out_on_postgres(
        pg_url: str, demo_dir: Path, burst: Burst) -> None:
    upgrade(pg_url)
    await waited_out(get_engine(pg_url), demo_dir, burst)


@pytest.mark.parametrize("burst", PAST_THE_BUDGET, ids=str)
def test_a_burst_past_the_budget_is_finished_by_one_resume_on_postgres(
        pg_url: str, demo_dir: Path, burst: Burst, monkeypatch: pytest.MonkeyPatch) -> None:
    upgrade(pg_url)
    past_the_budget(get_engine(pg_url), demo_dir, burst, monkeypatch)
