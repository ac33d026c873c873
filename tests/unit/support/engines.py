"""A BatchEngine over a fake server and a demo snapshot, as the batch tests build it."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine
from app.config import Settings, load_settings
from app.db.models import Batch
from app.runs.checkpoints import Checkpoints
from tests.fakevllm import FakeServer, Script


def make_engine(db: Engine, data_dir: Path, server: FakeServer, settings: Settings | None = None,
                *, sample_metrics: bool = False) -> BatchEngine:
    """Return an engine writing to ``db``, calling ``server``, reading the snapshot under
    ``data_dir``, its checkpoints in ``settings``' database. Settings default to no retry
    backoff and no context check; no /metrics sampling unless asked: the call path alone."""
    settings = settings or load_settings(check_context_length=False, retry_backoff_s=0)
    return BatchEngine(settings, db, http_client=server.client(),
                       provider=SnapshotProvider(data_dir), sample_metrics=sample_metrics,
                       checkpoints=Checkpoints(settings.store.database_url, db))


def fake_llm(monkeypatch: pytest.MonkeyPatch, script: Script | None = None,
             tickers: list[str] | None = None) -> FakeServer:
    """Point every BatchEngine, and the preflight's /v1/models, at a fake server serving the
    settings' model (no /metrics sampling, no network for facts)."""
    settings = load_settings()
    server = FakeServer(script, nodes=node_names(settings.pipeline()), tickers=tickers or [],
                        model=settings.llm.model)
    original = BatchEngine.__init__

    def with_fake(self: BatchEngine, *args: object, **kwargs: object) -> None:
        kwargs.update(http_client=server.client(), sample_metrics=False)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(BatchEngine, "__init__", with_fake)
    monkeypatch.setattr("app.runs.nightly.batch_server_facts", lambda *_: {})
    monkeypatch.setattr("serving.preflight.httpx.Client", lambda **_: server.sync_client())
    return server


def batch_count(engine: Engine) -> int:
    """Return how many batch rows ``engine``'s database holds."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Batch)).scalar_one())
