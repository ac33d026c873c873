"""Run the 200-concurrent-call tracker check against the real PostgreSQL."""

from __future__ import annotations

import pytest

import app.usage
from app.db.engine import get_engine, upgrade
from tests.unit.support.llm_calls import check_drive, drive_concurrent_calls, flaky_insert

pytestmark = pytest.mark.integration


async def test_200_concurrent_calls_write_one_row_per_attempt_on_postgres(pg_url: str) -> None:
    upgrade(pg_url)
    drive = await drive_concurrent_calls(get_engine(pg_url))
    check_drive(drive)


@pytest.mark.parametrize("after_write", [False, True], ids=["write-lost", "write-kept"])
async def test_failed_writes_are_retried_on_postgres(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, after_write: bool,
) -> None:
    upgrade(pg_url)
    insert, count = flaky_insert(2, after_write=after_write)
    monkeypatch.setattr(app.usage, "insert_ignoring_duplicates", insert)
    drive = await drive_concurrent_calls(get_engine(pg_url), n=60)
    check_drive(drive, n=60)
    assert drive.recorder.write_failures == 2
    assert count["calls"] >= 3

