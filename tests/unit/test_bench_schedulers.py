"""Check the scheduler bench's workload shape and that each strategy paces requests as named."""

from __future__ import annotations

from sqlalchemy import Engine, select

from agents.graph import chain_length
from app.batch.workload import shape
from app.bench.fakeserver import FakeServer, Reply
from app.bench.schedulers import run_bench
from app.bench.workloads import fit_scale, seed_shape, synthetic_workload
from app.config import load_settings
from app.db.models import LLMCall


def test_seed_shape_matches_the_seeds_per_call_averages() -> None:
    shape = seed_shape()
    assert len(shape) == 17
    mean_in = sum(s.prompt for s in shape) / 17
    assert 10_000 <= mean_in <= 12_000  # seeds: ~188k in per ticker, ≈11k per call
    assert all(s.output == 1_500 for s in shape)
    downstream = [s.prompt for s in shape[4:]]
    assert downstream == sorted(downstream)  # prompts grow along the graph


def test_synthetic_workload_fits_the_server_and_shares_a_prefix() -> None:
    settings = load_settings()
    scale = fit_scale(8192)
    load = synthetic_workload(settings, 3, scale)
    assert len(load) == 3 and all(len(v) == 17 for v in load.values())
    items = load["SYN000"]
    longest = max(len(i.body["messages"][1]["content"].split()) + i.body["max_tokens"]
                  for i in items)
    assert longest <= 8192
    downstream = [i.body["messages"][1]["content"] for i in items[4:]]
    prefix = downstream[0].split("\n\nRole")[0]
    assert all(d.startswith(prefix) for d in downstream)
    assert items[-1].deps[-1] == items[-2].node and items[0].deps == []
    # The scheduler's view of a ticker: 17 requests, the analysts side by side, then 13
    # one after another: the same chain the pipeline itself has.
    assert shape(items) == (17, 14) == (17, chain_length(settings.pipeline()))


def _max_overlap(engine: Engine, batch_id: int) -> int:
    with engine.connect() as conn:
        spans = conn.execute(select(LLMCall.started_at, LLMCall.ended_at)
                             .where(LLMCall.batch_id == batch_id)).all()
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                    key=lambda x: (x[0], x[1]))
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


async def test_each_strategy_sends_the_same_work_paced_as_named(sqlite_engine: Engine) -> None:
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    load = synthetic_workload(settings, 4, 0.002, output_scale=0.004)
    server = FakeServer(lambda chat: Reply("tok " * 6, delay_s=0.01, completion_tokens=6))
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["sequential", "fixed-2", "adaptive", "flood"],
                             sample_metrics=False, http_client=server.client())
    arms = {a["strategy"]: a for a in result.arms}
    assert all(a["calls"] == 68 and a["completion_tokens"] == 68 * 6 for a in arms.values())
    assert _max_overlap(sqlite_engine, arms["sequential"]["batch_id"]) == 1
    assert _max_overlap(sqlite_engine, arms["fixed-2"]["batch_id"]) <= 2 * 4
    assert _max_overlap(sqlite_engine, arms["flood"]["batch_id"]) > 17
    assert result.ceiling_arm in ("fixed-2", "flood")
    assert arms[result.ceiling_arm]["ratio_to_ceiling"] == 1.0
    # Per-arm cache salts: no arm can reuse another arm's prefix cache.
    salts = {c.body.get("cache_salt") for c in server.chats}
    assert len(salts) == 4
