"""Drop every PostgreSQL connection of a running batch, three times: it completes, no row lost.

Restarting the machine's PostgreSQL service would break every other test using it, so the
restart is shown as the batch's connections see it: each backend of the test database is
terminated (``pg_terminate_backend``), which is what a restart does to its clients. Every
pooled connection dies; the next statement on each fails, and the batch's pools, its
retried writes and its checkpointer must carry the night through.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.db.engine import get_engine, upgrade
from app.db.models import Batch, Decision, LLMCall, LLMRequest, TickerRun
from app.runs.checkpoints import Checkpoints
from tests.fakevllm import ChatRequest, FakeServer
from tests.integration.conftest import ADMIN_DSN

pytestmark = pytest.mark.integration

NODES = node_names(load_settings().pipeline())


def terminate_backends(database: str) -> int:
    """Terminate every backend connected to ``database``; return how many there were."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()", (database,)).fetchall()
    return len(rows)


async def test_a_batch_survives_postgres_dropping_every_connection(
        pg_url: str, tmp_path: Path) -> None:
    upgrade(pg_url)
    database = make_url(pg_url).database
    assert database
    tickers = demo_tickers(4)
    write_demo(tmp_path / "data", DEMO_AS_OF, len(tickers))
    killed: list[int] = []

    def restart_now_and_then(chat: ChatRequest) -> None:
        # Three "restarts": early (analysts), mid-debate and near the end of the night.
        if len(server.chats) in (6, 30, 55):
            killed.append(terminate_backends(database))

    server = FakeServer(restart_now_and_then, nodes=NODES, tickers=tickers)
    settings = load_settings(database_url=pg_url, retry_backoff_s=0.01)
    runner = BatchEngine(settings, get_engine(pg_url),
                         http_client=httpx.AsyncClient(transport=server.transport()),
                         provider=SnapshotProvider(tmp_path / "data"), sample_metrics=False,
                         checkpoints=Checkpoints(pg_url, get_engine(pg_url)))
    outcome = await runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers))

    assert len(killed) == 3 and all(n >= 1 for n in killed)  # connections were really cut
    assert outcome.status == "succeeded", outcome.failed
    engine = get_engine(pg_url)
    with engine.connect() as conn:
        status, succeeded = conn.execute(select(Batch.status, Batch.tickers_succeeded)).one()
        runs = set(conn.execute(select(TickerRun.status)).scalars())
        calls = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.status)).all()
        bodies = conn.execute(select(func.count()).select_from(LLMRequest)).scalar_one()
        decisions = Counter(conn.execute(select(Decision.ticker)).scalars())
        left = conn.execute(text("SELECT COUNT(*) FROM checkpoints")).scalar_one()
    assert (status, succeeded, runs) == ("succeeded", 4, {"succeeded"})
    # One row per request the server saw: none lost, none doubled by a retried write.
    assert len(calls) == len(server.chats) == 4 * 17
    assert Counter((t, n) for t, n, s in calls if s == "ok") == Counter(
        (t, n) for t in tickers for n in NODES)
    assert bodies == 4 * 17
    assert decisions == Counter(dict.fromkeys(tickers, 1))
    assert left == 0  # the finished batch's checkpoints were pruned
