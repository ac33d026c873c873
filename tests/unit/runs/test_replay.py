"""Every request body is recorded, re-asks and replays included, so any batch can be replayed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

from agents.data.demo import DEMO_AS_OF, demo_tickers
from agents.data.snapshot import SnapshotProvider
from agents.graph import node_names
from app.batch.engine import BatchEngine, BatchPlan
from app.config import load_settings
from app.db.models import Batch, LLMCall, LLMRequest, batch_row
from app.errors import InputError
from app.morning.summary import batch_summary
from app.runs.replay import replay_batch
from app.runs.resumable import pick
from app.usage import decompress_body
from tests.fakevllm import ChatRequest, FakeServer, Reply
from tests.unit.support.engines import make_engine


def sent(server: FakeServer) -> list[str]:
    """Return every chat body the server received, as canonical JSON, in a stable order."""
    return sorted(json.dumps(c.body, sort_keys=True) for c in server.chats)


async def test_a_replay_is_faithful_and_can_itself_be_replayed(sqlite_engine: Engine,
                                                               demo_dir: Path) -> None:
    tickers = demo_tickers(2)
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    nodes = node_names(settings.pipeline())
    asked: Counter[str] = Counter()

    def first_decision_invalid(chat: ChatRequest) -> Reply | None:
        if chat.structured:
            asked[str(chat.ticker)] += 1
            if asked[str(chat.ticker)] == 1:
                return Reply("not json")  # the portfolio manager is asked again
        return None

    night = FakeServer(first_decision_invalid, nodes=nodes, tickers=tickers)
    source = await make_engine(sqlite_engine, demo_dir, night, settings).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert source.status == "succeeded"
    assert len(night.chats) == 2 * 18  # 17 nodes and one re-ask each
    with sqlite_engine.connect() as conn:
        keys = conn.execute(select(LLMRequest.call_id)
                            .where(LLMRequest.batch_id == source.batch_id)).all()
        asks = conn.execute(select(LLMRequest.call_id, LLMRequest.body).where(
            LLMRequest.batch_id == source.batch_id, LLMRequest.ticker == tickers[0],
            LLMRequest.node == "portfolio_manager").order_by(LLMRequest.id)).all()
        rows = conn.execute(select(LLMCall.call_id, LLMCall.attempt).where(
            LLMCall.batch_id == source.batch_id, LLMCall.ticker == tickers[0],
            LLMCall.node == "portfolio_manager")).all()
    assert len(keys) == len(night.chats)
    # The re-ask is its own call with its own body; each call's one attempt is its first.
    assert sorted(tuple(r) for r in rows) == sorted((a.call_id, 1) for a in asks)
    assert len({a.call_id for a in asks}) == 2
    reask: dict[str, Any] = decompress_body(asks[1].body)
    assert reask["messages"][-2] == {"role": "assistant", "content": "not json"}

    replays = []
    for of in (source.batch_id, None):
        server = FakeServer(nodes=nodes, tickers=tickers)
        outcome = await replay_batch(settings, sqlite_engine,
                                     of if of is not None else replays[-1][0].batch_id,
                                     match_output=False, sample_metrics=False,
                                     http_client=server.client())
        assert outcome.status == "succeeded", outcome.failed
        replays.append((outcome, server))
    (first, first_server), (second, second_server) = replays
    # The replay sent exactly what the night sent, the re-asks included; the replay of the
    # replay sent exactly that again.
    assert sent(first_server) == sent(night)
    assert sent(second_server) == sent(first_server)
    with sqlite_engine.connect() as conn:
        for replay in (first, second):
            calls = conn.execute(select(LLMCall.call_id, LLMCall.attempt).where(
                LLMCall.batch_id == replay.batch_id, LLMCall.ticker == tickers[0],
                LLMCall.node == "portfolio_manager")).all()
            # One row per attempt, none dropped as a duplicate: two calls of one attempt.
            assert sorted(a for _, a in calls) == [1, 1] and len({c for c, _ in calls}) == 2


async def test_a_replay_stopped_short_names_no_resume_it_cannot_have(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(2)
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    nodes = node_names(settings.pipeline())
    night = FakeServer(nodes=nodes, tickers=tickers)
    source = await BatchEngine(settings, sqlite_engine, http_client=night.client(),
                               provider=SnapshotProvider(demo_dir), sample_metrics=False
                               ).run(BatchPlan("nightly", DEMO_AS_OF, tickers))
    # The replay's server stops serving the model part-way: the batch stops at once.
    gone = FakeServer(lambda chat: Reply(status=404) if chat.index >= 5 else None,
                      nodes=nodes, tickers=tickers)
    outcome = await replay_batch(settings, sqlite_engine, source.batch_id, match_output=False,
                                 sample_metrics=False, http_client=gone.client())
    assert outcome.status == "failed" and outcome.halt is not None
    assert "HTTP 404" in outcome.halt.message
    # `run --resume` takes nightly batches and reruns only: a replay is run again anew.
    with pytest.raises(InputError, match="only nightly and rerun batches resume"):
        pick(sqlite_engine, outcome.batch_id)
    assert "--resume" not in outcome.halt.message, outcome.halt.message


async def test_a_ticker_of_the_night_that_sent_nothing_is_named_not_replayed(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    tickers = demo_tickers(3)
    (demo_dir / DEMO_AS_OF.isoformat() / tickers[1] / "prices.csv").write_text("oops\n")
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    nodes = node_names(settings.pipeline())
    night = FakeServer(nodes=nodes, tickers=tickers)
    source = await make_engine(sqlite_engine, demo_dir, night, settings).run(
        BatchPlan("nightly", DEMO_AS_OF, tickers))
    assert list(source.failed) == [tickers[1]]  # its data did not load: no request recorded
    # The snapshot is gone since: the replay sends the prompts as recorded all the same.
    for path in sorted(demo_dir.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    server = FakeServer(nodes=nodes, tickers=tickers)
    outcome = await replay_batch(settings, sqlite_engine, source.batch_id, match_output=False,
                                 sample_metrics=False, http_client=server.client())
    assert outcome.status == "succeeded" and sorted(outcome.succeeded) == [tickers[0], tickers[2]]
    assert sent(server) == sent(night)
    # Two tickers replayed of the night's three: the third is named, not dropped unsaid.
    assert batch_row(sqlite_engine, outcome.batch_id).settings["universe_notes"] == [
        f"not replayed: 1 of batch {source.batch_id}'s tickers recorded no request (failed "
        f"before their first call): {tickers[1]}"]


async def test_the_replay_of_a_demo_night_is_labelled_demo(sqlite_engine: Engine,
                                                           demo_dir: Path) -> None:
    # Its prompts are the DEMO night's, DEMO data and all; `batches`, `report --compare`
    # and the pages read the label from the batch's settings, which a replay lacked.
    tickers = demo_tickers(2)
    settings = load_settings(check_context_length=False)
    nodes = node_names(settings.pipeline())

    async def replay(batch_id: int) -> int:
        outcome = await replay_batch(settings, sqlite_engine, batch_id, sample_metrics=False,
                                     http_client=FakeServer(nodes=nodes, tickers=tickers).client())
        assert outcome.status == "succeeded"
        return outcome.batch_id

    night = await make_engine(sqlite_engine, demo_dir, FakeServer(nodes=nodes, tickers=tickers),
                              settings).run(BatchPlan("nightly", DEMO_AS_OF, tickers))
    first = await replay(night.batch_id)
    second = await replay(first)  # a replay of the replay
    for batch_id in (night.batch_id, first, second):
        assert batch_summary(sqlite_engine, batch_id, 120).demo is True, batch_id
    # A night on market data: its replay is not labelled.
    with sqlite_engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == night.batch_id).values(settings={
            **batch_row(sqlite_engine, night.batch_id).settings, "demo_data": False}))
    assert batch_summary(sqlite_engine, await replay(night.batch_id), 120).demo is False
