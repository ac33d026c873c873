"""The fault suite's bursts on the real PostgreSQL (the scenarios: tests/unit/support/bursts.py):
a 429/503 burst within the budget is waited out; one past it stops the night resumable and one
`run --resume` finishes it; ``llm_calls`` equals the fake server's request log."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.db.engine import get_engine, upgrade
from tests.integration.conftest import private_database
from tests.unit.support.bursts import (
    PAST_THE_BUDGET,
    WAITED_OUT,
    Burst,
    past_the_budget,
    waited_out,
)

pytestmark = pytest.mark.integration


_NUMBERS = itertools.count()


@pytest.fixture
def night_db() -> Iterator[str]:
    """A database of this test's own: its nights must not be seen by the session's other
    tests (one batch each, a blank schema)."""
    with private_database(f"nightdesk_faults_{os.getpid()}_{next(_NUMBERS)}") as url:
        yield url


# One of each kind and place, so the suite stays short on the shared server.
ON_POSTGRES = [WAITED_OUT[2], WAITED_OUT[4], WAITED_OUT[7]]


@pytest.mark.parametrize("burst", ON_POSTGRES, ids=str)
async def test_a_burst_within_the_budget_is_waited_out_on_postgres(
        night_db: str, demo_dir: Path, burst: Burst) -> None:
    upgrade(night_db)
    await waited_out(get_engine(night_db), demo_dir, burst)


@pytest.mark.parametrize("burst", PAST_THE_BUDGET, ids=str)
def test_a_burst_past_the_budget_is_finished_by_one_resume_on_postgres(
        night_db: str, demo_dir: Path, burst: Burst, monkeypatch: pytest.MonkeyPatch) -> None:
    upgrade(night_db)
    past_the_budget(get_engine(night_db), demo_dir, burst, monkeypatch)
