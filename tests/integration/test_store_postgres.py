"""Store a night whose replies carry text PostgreSQL refuses, on the real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.db.engine import get_engine, upgrade
from app.db.models import Batch, Decision, TickerRun
from app.runs.checkpoints import Checkpoints
from tests.fakevllm import FakeServer
from tests.unit.support.servers import nul_script

pytestmark = pytest.mark.integration


async def test_a_nul_byte_in_a_reply_is_stored_on_postgres(pg_url: str, tmp_path: Path) -> None:
    upgrade(pg_url)
    engine = get_engine(pg_url)
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    tickers = demo_tickers(2)
    settings = load_settings(database_url=pg_url, check_context_length=False,
                             retry_backoff_s=0)
    server = FakeServer(nul_script, nodes=node_names(settings.pipeline()), tickers=tickers)
    runner = BatchEngine(settings, engine, http_client=server.client(),
                         provider=SnapshotProvider(tmp_path / "data"), sample_metrics=False,
                         checkpoints=Checkpoints(settings.store.database_url, engine))
    outcome = await runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert outcome.status == "succeeded", outcome.failed
    with engine.connect() as conn:
        status = conn.execute(select(Batch.status).where(Batch.id == outcome.batch_id)).scalar()
        runs = set(conn.execute(select(TickerRun.status)
                                .where(TickerRun.batch_id == outcome.batch_id)).scalars())
        summaries = conn.execute(select(Decision.summary)
                                 .where(Decision.batch_id == outcome.batch_id)).scalars().all()
    assert status == "succeeded" and runs == {"succeeded"}
    assert summaries == ["Steady trend.", "Steady trend."]
