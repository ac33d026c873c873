"""Serve the web pages and API from PostgreSQL: the same constructed rows as the unit tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.db.engine import get_engine
from app.db.lock import nightly_lock
from app.web.auth import Guard
from app.web.reruns import RerunQueue
from app.web.server import create_app
from tests.integration.conftest import private_database
from tests.unit.support.web_rows import D1, Ids, fill

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg_web_url() -> Iterator[str]:
    """A database of its own: the rows here must not meet other tests' batches."""
    with private_database(f"nightdesk_web_{os.getpid()}", upgraded=True) as url:
        yield url


def test_pages_and_api_on_postgres(pg_web_url: str) -> None:
    engine = get_engine(pg_web_url)
    ids: Ids = fill(engine)
    # Night 2 runs: on PostgreSQL a running night holds the nightly advisory lock, and a
    # night whose lock is free reads crashed at once (app.db.lock.run_gone).
    with nightly_lock(engine), TestClient(create_app(engine, Guard("u", "p"), RerunQueue(),
                                                     stale_after_s=120.0)) as client:
        ranking = client.get("/api/ranking", auth=("u", "p")).json()
        assert ranking["batch"]["id"] == ids.night1 and ranking["batch"]["as_of"] == str(D1)
        assert [(r["ticker"], r["rating"], r["batch_id"]) for r in ranking["rows"]] == [
            ("AAA", "Buy", ids.night1), ("BBB", "Sell", ids.rerun)]
        assert [r["id"] for r in ranking["running"]] == [ids.night2]
        ticker = client.get("/api/tickers/AAA", auth=("u", "p")).json()
        assert len(ticker["shown"]["runs"][0]["nodes"]) == 17
        assert [p["as_of"] for p in ticker["history"]] == ["2026-11-25", "2026-11-26"]
        batch = client.get(f"/api/batches/{ids.night1}", auth=("u", "p")).json()
        assert batch["server"]["running_max"] == 6.0 and len(batch["series"]["t"]) == 4
        compare = client.get(f"/api/batches/compare?ids={ids.night1},{ids.rerun}",
                             auth=("u", "p")).json()
        assert [a["batch_id"] for a in compare["arms"]] == [ids.night1, ids.rerun]
        for path in ("/", "/ticker/AAA", "/batches", f"/batches/{ids.night1}"):
            assert client.get(path, auth=("u", "p")).status_code == 200, path
        assert client.get("/healthz").json()["database"] == "ok"
