"""The schema's checks, run on SQLite by the unit tests and on PostgreSQL by the integration
tests."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, func, insert, inspect, select, text

from app.db.engine import alembic_config, current_revision, get_engine, head_revision, upgrade
from app.db.models import Base, Batch, LLMCall, LLMRequest
from app.morning.summary import list_batches
from app.runs.replay import recorded_workload
from app.usage import compress_body, insert_ignoring_duplicates


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
    check_schema(engine)  # context-trim columns and the call ids are there now
    assert current_revision(engine) == head_revision() == "0017_crashed_ends"
    upgrade(url)  # and nothing runs twice
    check_schema(engine)


def check_legacy_rows_keep_working(url: str) -> None:
    """Upgrade rows stored before call ids, use them as a resume and a replay would, go back."""
    cfg = alembic_config(url)
    command.upgrade(cfg, "0010_ready_at")
    engine = get_engine(url)
    batch = _store_legacy_rows(engine)
    upgrade(url)
    check_schema(engine)
    with engine.connect() as conn:
        calls = conn.execute(select(LLMCall.node, LLMCall.call_id, LLMCall.attempt)
                             .order_by(LLMCall.id)).all()
        bodies = conn.execute(select(LLMRequest.call_id).order_by(LLMRequest.id)).scalars()
        assert list(bodies) == [f"{batch}:AAA:trader:0:1", f"{batch}:AAA:portfolio_manager:0:1",
                                f"{batch}:AAA:portfolio_manager:0:3"]
    # Grouped by the body they were sent with, numbered from 1 within it; none lost.
    assert [(node, call_id.split(":")[-1], attempt) for node, call_id, attempt in calls] == [
        ("trader", "1", 1), ("trader", "1", 2), ("portfolio_manager", "1", 1),
        ("portfolio_manager", "1", 2), ("portfolio_manager", "3", 1),
        ("portfolio_manager", "3", 2), ("market", "1", 1), ("market", "1", 2)]
    # The re-ask replays as its own request, after the first ask.
    _, workload = recorded_workload(engine, batch, match_output=False)
    assert [(i.name, i.body["messages"][0]["content"]) for i in workload["AAA"]] == [
        ("trader", "trader 1"), ("portfolio_manager", "portfolio_manager 1"),
        ("portfolio_manager#2", "portfolio_manager 3")]
    # A resumed batch adds its rows beside the old ones: each its own call, from attempt 1.
    now = datetime.now(UTC)
    insert_ignoring_duplicates(engine, LLMCall.__table__, [  # type: ignore[arg-type]
        {"batch_id": batch, "ticker": "AAA", "node": "trader", "sample": 0, "call_id": "new",
         "attempt": 1, "model": "m", "status": "ok", "started_at": now, "ended_at": now,
         "latency_s": 0.0}])
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(LLMCall)).scalar_one() == 9

    command.downgrade(cfg, "0010_ready_at")
    with engine.connect() as conn:
        back = conn.execute(text("SELECT node, attempt FROM llm_calls ORDER BY id")).all()
        firsts = conn.execute(text("SELECT node, attempt FROM llm_requests ORDER BY id")).all()
    assert [tuple(r) for r in back] == [*LEGACY_CALLS, ("trader", 3)]
    assert [tuple(r) for r in firsts] == LEGACY_BODIES
    upgrade(url)
    check_schema(engine)


EXPECTED = {
    "batches": {
        "id", "kind", "label", "as_of", "status", "created_at", "started_at", "finished_at",
        "heartbeat_at", "settings", "server_facts", "source_batch_id", "tickers_total",
        "tickers_succeeded", "tickers_failed", "error",
    },
    "ticker_runs": {
        "id", "batch_id", "ticker", "status", "attempt", "samples", "started_at",
        "finished_at", "error", "failure_class",
    },
    "llm_calls": {
        "id", "batch_id", "ticker", "node", "sample", "call_id", "attempt", "model",
        "prompt_tokens",
        "completion_tokens", "cached_tokens", "max_tokens", "finish_reason", "status",
        "error_class", "http_status", "error", "started_at", "first_token_at", "ended_at",
        "ready_at", "latency_s", "request_id", "context_trimmed_tokens", "context_trimmed",
        "endpoint", "served_by",
    },
    "llm_requests": {"id", "batch_id", "ticker", "node", "sample", "call_id", "body"},
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
        "decode_time_s_total", "endpoint", "client_lag_s", "chain_slots",
    },
    "node_outputs": {
        "id", "batch_id", "ticker", "sample", "node", "position", "text", "prompt_tokens",
        "completion_tokens", "finish_reason", "attempts", "created_at",
    },
    "scheduler_heartbeats": {"host", "pid", "started_at", "beat_at", "next_run_at", "schedule"},
    "night_refusals": {"id", "refused_at", "as_of", "title", "why", "advice", "command"},
    "progress_readings": {
        "id", "batch_id", "taken_at", "calls_expected", "calls_done", "attempts",
        "output_tokens", "tokens_left", "rate_tok_s", "rate_low_tok_s", "rate_high_tok_s",
        "rate_source", "chain_left", "chain_s", "chain_low_s", "chain_high_s", "eta_s",
        "eta_low_s", "eta_high_s",
    },
}


UNIQUE = {
    "ticker_runs": ["batch_id", "ticker"],
    "llm_calls": ["call_id", "attempt"],
    "llm_requests": ["call_id"],
    "decisions": ["batch_id", "ticker", "sample"],
    "node_outputs": ["batch_id", "ticker", "sample", "node"],
}


# Rows as a build before call ids stored them: (node, attempt) of each llm_calls row, and
# the first attempt of each recorded body. The trader's first attempt failed; the portfolio
# manager's decision was asked again from attempt 3; the market node's body was not kept.
LEGACY_CALLS = [("trader", 1), ("trader", 2), ("portfolio_manager", 1),
                ("portfolio_manager", 2), ("portfolio_manager", 3), ("portfolio_manager", 4),
                ("market", 1), ("market", 2)]


LEGACY_BODIES = [("trader", 1), ("portfolio_manager", 1), ("portfolio_manager", 3)]


def check_crashed_rows_end_when_last_alive(url: str) -> None:
    """Rows marked crashed before the marking stored the last sign of life (their end the
    marking's moment) end, once upgraded, where every view's duration ends: the later of the
    last heartbeat and the last call's end, else the start. Other rows are left alone."""
    command.upgrade(alembic_config(url), "0016_night_refusals")
    engine = get_engine(url)
    start = datetime(2026, 1, 2, tzinfo=UTC)
    marked = start + timedelta(hours=5)  # when a later `report` found each dead

    def batch(conn: Any, status: str, beat_s: float | None, calls_s: list[float]) -> int:
        # Through the models' types: the stored texts are SQLite's as the service writes them.
        batch_id = int(conn.execute(insert(Batch).values(
            kind="nightly", as_of=start.date(), status=status, created_at=start,
            started_at=start, finished_at=marked, settings={}, tickers_total=1,
            heartbeat_at=None if beat_s is None else start + timedelta(seconds=beat_s))
            .returning(Batch.id)).scalar_one())
        for n, end_s in enumerate(calls_s):
            conn.execute(insert(LLMCall).values(
                batch_id=batch_id, ticker="AAA", node=f"n{n}", model="m", status="ok",
                started_at=start, ended_at=start + timedelta(seconds=end_s), latency_s=0.5))
        return batch_id

    with engine.begin() as conn:
        ids = {"call after beat": batch(conn, "crashed", 60.0, [30.0, 95.5]),
               "beat after call": batch(conn, "crashed", 120.0, [30.0]),
               "killed before a beat": batch(conn, "crashed", None, [42.0]),
               "nothing": batch(conn, "crashed", None, []),
               "succeeded": batch(conn, "succeeded", 60.0, [95.5])}
    upgrade(url)
    upgrade(url)  # again: nothing changes
    with engine.connect() as conn:
        ends = dict(conn.execute(select(Batch.id, Batch.finished_at)).tuples().all())
    assert {name: (ends[i] - start).total_seconds() for name, i in ids.items()} == {
        "call after beat": 95.5, "beat after call": 120.0, "killed before a beat": 42.0,
        "nothing": 0.0, "succeeded": (marked - start).total_seconds()}
    # What every view reads of them now is what the table holds.
    summaries = {s.id: s for s in list_batches(engine, 120.0)}
    for name, batch_id in ids.items():
        if name != "succeeded":
            assert summaries[batch_id].duration_s == (ends[batch_id] - start).total_seconds()


def _store_legacy_rows(engine: Engine) -> int:
    at = datetime(2026, 1, 2, tzinfo=UTC)
    with engine.begin() as conn:
        batch = conn.execute(text(
            "INSERT INTO batches (kind, as_of, status, created_at, settings, tickers_total,"
            " tickers_succeeded, tickers_failed) VALUES ('nightly', '2026-01-02', 'running',"
            " :at, '{}', 1, 0, 0) RETURNING id"), {"at": at}).scalar_one()
        for n, (node, attempt) in enumerate(LEGACY_CALLS):
            started = at + timedelta(seconds=n)
            conn.execute(text(
                "INSERT INTO llm_calls (batch_id, ticker, node, sample, attempt, model, status,"
                " started_at, ended_at, latency_s) VALUES (:b, 'AAA', :node, 0, :attempt, 'm',"
                " :status, :start, :end, 0.5)"),
                {"b": batch, "node": node, "attempt": attempt, "start": started,
                 "end": started + timedelta(seconds=0.5),
                 "status": "error" if (node, attempt) == ("trader", 1) else "ok"})
        for node, attempt in LEGACY_BODIES:
            body = {"messages": [{"role": "user", "content": f"{node} {attempt}"}],
                    "max_tokens": 8}
            conn.execute(text(
                "INSERT INTO llm_requests (batch_id, ticker, node, sample, attempt, body)"
                " VALUES (:b, 'AAA', :node, 0, :attempt, :body)"),
                {"b": batch, "node": node, "attempt": attempt, "body": compress_body(body)})
    return int(batch)
