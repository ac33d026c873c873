"""`nightdesk batches` lists in the one order of nights, as the ranking reads them.

Before, it listed by batch id: a date analyzed again later (`run --as-of` an older date)
headed the list while the ranking and the night's status named the latest date's night.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app.db.models import Batch
from app.morning.summary import list_batches
from tests.unit.support.clirun import run_cli
from tests.unit.support.webclient import AUTH

T0 = datetime(2026, 12, 5, 1, 0, tzinfo=UTC)


def _batch(engine: Engine, as_of: date, at: datetime) -> int:
    with Session(engine) as s:
        row = Batch(kind="nightly", as_of=as_of, status="succeeded", created_at=at,
                    started_at=at, finished_at=at + timedelta(minutes=30), tickers_total=1,
                    tickers_succeeded=1)
        s.add(row)
        s.commit()
        return int(row.id)


def test_batches_list_the_latest_date_first_not_the_batch_made_last(
        sqlite_engine: Engine, client: TestClient) -> None:
    tonight = _batch(sqlite_engine, date(2026, 12, 4), T0)
    older_again = _batch(sqlite_engine, date(2026, 11, 20), T0 + timedelta(hours=2))
    order = [tonight, older_again]
    assert [b.id for b in list_batches(sqlite_engine, 120.0)] == order
    assert [b["id"] for b in client.get("/api/batches", auth=AUTH).json()] == order
    said = run_cli("batches", "--format", "csv", "--limit", "1")
    assert said.code == 0 and said.stdout.splitlines()[1].startswith(f"{tonight},"), said
