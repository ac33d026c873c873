"""Run a night against a fake server with faults, and check what it left (SQLite or PostgreSQL).

The fault suite's common parts: ``night_engine`` runs a batch with sleeps shrunk through the
settings (backoff, the longest wait, which caps a ``Retry-After`` too), and
``assert_rows_match_the_servers`` holds ``llm_calls`` to the fake servers' own request logs.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine
from app.config import load_settings
from app.db.models import LLMCall, TickerRun
from tests.fakevllm import FakeServer
from tests.unit.support.engines import make_engine

NODES = node_names(load_settings().pipeline())
# Short waits: a test's night spends its time calling, not sleeping. The longest wait caps
# a Retry-After too (test_back_pressure.py shows one honoured in full).
QUICK = {"check_context_length": False, "retry_backoff_s": 0.01, "retry_wait_max_s": 0.05,
         "server_probe_interval_s": 0.05}
QUICK_ENV = {f"NIGHTDESK_{key.upper()}": str(value) for key, value in QUICK.items()}


def night_engine(db: Engine, demo_dir: Path, server: FakeServer,
                 **overrides: Any) -> BatchEngine:
    settings = load_settings(**{**QUICK, "database_url": str(db.url.render_as_string(
        hide_password=False)), **overrides})
    return make_engine(db, demo_dir, server, settings)


def serve_cli_from(monkeypatch: pytest.MonkeyPatch, server: FakeServer, demo_dir: Path) -> None:
    """Make every batch the CLI runs call ``server`` and read the demo snapshot; called
    again, the batches from then on call the new ``server``."""
    # The real __init__, not an earlier call's wrapper: wrapped twice, the first server's
    # client would overwrite the second's, and the later runs would call the first server.
    original = getattr(BatchEngine.__init__, "unfaked", BatchEngine.__init__)

    def with_fake(self: BatchEngine, *args: Any, **kwargs: Any) -> None:
        kwargs.update(http_client=server.client(), sample_metrics=False,
                      provider=SnapshotProvider(demo_dir))
        original(self, *args, **kwargs)

    with_fake.unfaked = original  # type: ignore[attr-defined]
    monkeypatch.setattr(BatchEngine, "__init__", with_fake)


def server_log(servers: list[FakeServer]) -> Counter[tuple[Any, ...]]:
    """Count the chat requests the servers saw: (ticker, node, ok or error, HTTP status);
    one refused while a server was down is an error of no status (the client's row has none)."""
    seen: Counter[tuple[Any, ...]] = Counter()
    for server in servers:
        seen.update((ticker, node, "error", None) for ticker, node in server.refused_chats)
        for chat in server.chats:
            status = None if chat.served is None or chat.served.status == 200 \
                else chat.served.status
            seen[(chat.ticker, chat.node, "ok" if chat.completed else "error", status)] += 1
    return seen


def assert_rows_match_the_servers(db: Engine, batch_id: int,
                                  servers: list[FakeServer]) -> None:
    """Assert that the batch's ``llm_calls`` are the servers' chat requests, one row each,
    and that no node of a ticker was answered twice."""
    with db.connect() as conn:
        rows = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.sample,
                                   LLMCall.status, LLMCall.http_status)
                            .where(LLMCall.batch_id == batch_id)).all()
    stored = Counter((r.ticker, r.node, r.status, r.http_status) for r in rows)
    assert stored == server_log(servers)
    answered = Counter((r.ticker, r.node, r.sample) for r in rows if r.status == "ok")
    assert set(answered.values()) == {1}, answered.most_common(3)


def ticker_states(db: Engine, batch_id: int) -> dict[str, tuple[str, str | None]]:
    """Return each ticker's (status, failure class) in the batch."""
    with db.connect() as conn:
        return {r.ticker: (r.status, r.failure_class) for r in conn.execute(
            select(TickerRun.ticker, TickerRun.status, TickerRun.failure_class)
            .where(TickerRun.batch_id == batch_id))}
