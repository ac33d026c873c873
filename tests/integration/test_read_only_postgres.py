"""Read commands and the web pages serve what is stored while PostgreSQL takes no writes
(``default_transaction_read_only`` on the database): the SQLite checks of
tests/unit/db/test_readonly.py on a private database."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql

from app.db.engine import get_engine, upgrade
from app.web.auth import Guard
from app.web.reruns import RerunQueue
from app.web.server import create_app
from tests.integration.conftest import ADMIN_DSN, private_database
from tests.unit.support.read_checks import STALE, check_reads, read_all
from tests.unit.support.web_rows import Ids, fill

pytestmark = pytest.mark.integration


@pytest.fixture
def two_databases() -> Iterator[tuple[str, str]]:
    with (private_database(f"nightdesk_ro_{os.getpid()}") as read_only,
          private_database(f"nightdesk_rw_{os.getpid()}") as writable):
        yield read_only, writable


def _filled(url: str) -> Ids:
    upgrade(url)
    ids = fill(get_engine(url), night2_heartbeat=STALE)
    get_engine(url).dispose()
    return ids


def test_read_commands_and_pages_serve_a_read_only_postgres(
        two_databases: tuple[str, str]) -> None:
    read_only, writable = two_databases
    ids = _filled(read_only)
    assert _filled(writable) == ids
    name = read_only.rsplit("/", 1)[1]
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
                      .format(sql.Identifier(name)))
    with pytest.raises(Exception, match="read-only transaction"), \
            get_engine(read_only).begin() as conn:
        conn.exec_driver_sql("DELETE FROM batch_warnings")
    check_reads(read_all(read_only, ids), read_all(writable, ids), ids)
    with TestClient(create_app(get_engine(read_only), Guard("u", "p"), RerunQueue(),
                               stale_after_s=120.0)) as client:
        for page in ("/", "/ticker/AAA", "/batches", f"/batches/{ids.night1}", "/track",
                     "/api/ranking", f"/api/batches/{ids.night1}", "/api/tickers/AAA"):
            assert client.get(page, auth=("u", "p")).status_code == 200, page
    get_engine(read_only).dispose()
