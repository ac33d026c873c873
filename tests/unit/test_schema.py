"""Pin the exact columns of every table and check the migration chain matches the models."""

from __future__ import annotations

import importlib

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect

from app.db.engine import alembic_config, current_revision, get_engine, head_revision, upgrade
from app.db.models import Base

EXPECTED = {
    "batches": {
        "id", "kind", "label", "as_of", "status", "created_at", "started_at", "finished_at",
        "heartbeat_at", "settings", "server_facts", "source_batch_id", "tickers_total",
        "tickers_succeeded", "tickers_failed", "error",
    },
    "ticker_runs": {
        "id", "batch_id", "ticker", "status", "attempt", "samples", "started_at",
        "finished_at", "error",
    },
    "llm_calls": {
        "id", "batch_id", "ticker", "node", "sample", "attempt", "model", "prompt_tokens",
        "completion_tokens", "cached_tokens", "max_tokens", "finish_reason", "status",
        "error_class", "http_status", "error", "started_at", "first_token_at", "ended_at",
        "ready_at", "latency_s", "request_id", "context_trimmed_tokens", "context_trimmed",
        "endpoint",
    },
    "llm_requests": {"id", "batch_id", "ticker", "node", "sample", "attempt", "body"},
    "decisions": {
        "id", "batch_id", "ticker", "sample", "rating", "score", "confidence", "summary",
        "created_at", "contradicts",
    },
    "batch_warnings": {"id", "batch_id", "kind", "message", "details", "created_at"},
    "server_samples": {
        "id", "batch_id", "sampled_at", "running", "waiting", "kv_cache_usage",
        "preemptions_total", "prompt_tokens_total", "generation_tokens_total",
        "prefix_cache_queries_total", "prefix_cache_hits_total", "spec_drafts_total",
        "spec_draft_tokens_total", "spec_accepted_tokens_total", "prefill_time_s_total",
        "decode_time_s_total", "endpoint", "client_lag_s",
    },
    "node_outputs": {
        "id", "batch_id", "ticker", "sample", "node", "position", "text", "prompt_tokens",
        "completion_tokens", "finish_reason", "attempts", "created_at",
    },
    "scheduler_heartbeats": {"host", "pid", "started_at", "beat_at", "next_run_at", "schedule"},
}

UNIQUE = {
    "ticker_runs": ["batch_id", "ticker"],
    "llm_calls": ["batch_id", "ticker", "node", "sample", "attempt"],
    "llm_requests": ["batch_id", "ticker", "node", "sample", "attempt"],
    "decisions": ["batch_id", "ticker", "sample"],
    "node_outputs": ["batch_id", "ticker", "sample", "node"],
}


def check_schema(engine: Engine) -> None:
    """Assert the upgraded database has exactly the expected tables, columns and keys."""
    inspector = inspect(engine)
    assert set(inspector.get_table_names()) == set(EXPECTED) | {"alembic_version"}
    for table, columns in EXPECTED.items():
        assert {c["name"] for c in inspector.get_columns(table)} == columns, table
    for table, key in UNIQUE.items():
        uniques = [u["column_names"] for u in inspector.get_unique_constraints(table)]
        assert key in uniques, (table, uniques)
    for table in ("batches", "llm_calls", "decisions"):
        for col in inspector.get_columns(table):
            if col["name"].endswith("_at"):
                # Timezone-aware where the backend can say so (PostgreSQL timestamptz).
                assert engine.dialect.name == "sqlite" or col["type"].timezone, col
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], diff


def test_blank_sqlite_upgrades_to_the_models(sqlite_engine: Engine) -> None:
    check_schema(sqlite_engine)


def check_reordered_catch_up(url: str) -> None:
    """Build a database as a build from before the reliability merge left it, then upgrade.

    That build ran 0003 and then the quality revision on top, stamped "0003_quality": the
    id that is now the head of the longer chain. Upgrading must add what it skipped.
    """
    cfg = alembic_config(url)
    command.upgrade(cfg, "0003")
    engine = get_engine(url)
    quality = importlib.import_module("migrations.versions.0006_quality_flags")
    with engine.begin() as conn, Operations.context(
            MigrationContext.configure(conn, opts={"render_as_batch": True})):
        quality.upgrade()
    command.stamp(cfg, "0003_quality", purge=True)
    assert "context_trimmed" not in {c["name"] for c in inspect(engine).get_columns("llm_calls")}

    upgrade(url)
    check_schema(engine)  # context-trim columns and llm_requests.attempt are there now
    assert current_revision(engine) == head_revision() == "0010_ready_at"
    upgrade(url)  # and nothing runs twice
    check_schema(engine)


def test_a_database_stamped_before_the_reordering_gets_the_revisions_it_skipped(
        sqlite_url: str) -> None:
    check_reordered_catch_up(sqlite_url)
