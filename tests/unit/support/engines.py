"""A BatchEngine over a fake server and a demo snapshot, as the batch tests build it."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from agents.data.snapshot import SnapshotProvider
from app.batch.engine import BatchEngine
from app.config import load_settings
from tests.fakevllm import FakeServer


def make_engine(sqlite_engine: Engine, demo_dir: Path, server: FakeServer) -> BatchEngine:
    """No retry backoff, no context check, no /metrics sampling: the call path alone."""
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    return BatchEngine(settings, sqlite_engine, http_client=server.client(),
                       provider=SnapshotProvider(demo_dir), sample_metrics=False)
