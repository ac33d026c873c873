"""Check the scheduler bench's workload shape and that each strategy paces requests as named."""

from __future__ import annotations

from sqlalchemy import Engine, select

from agents.graph import chain_length
from app.batch.workload import shape
from app.bench.fakeserver import BASE_URL, FakeServer, Reply
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


async def test_the_bench_orders_arms_as_a_server_of_known_capacity_dictates(
        sqlite_engine: Engine) -> None:
    # A fake that serves 2 requests at once, each 20 tokens x 2 ms. In units of one request:
    # a ticker alone (fixed-1) takes 2 for its four analysts plus 13 for its chain, 30 for
    # two tickers; both at once (fixed-2) take 4 + 13 = 17, and so does flood (34 requests
    # over 2 places). So fixed-1 reaches at most 17/30 = 0.57 of the ceiling (less when each
    # step's own latency adds up along its longer chain of steps), fixed-2 and flood all of
    # it. Were the server unbounded, flood (every request at once) would beat fixed-2
    # several times over; were it one place, fixed-1 would be as fast as any arm. Readings
    # are on, so adaptive runs with the fake's live gauges.
    settings = load_settings(check_context_length=False, retry_backoff_s=0,
                             llm_base_url=BASE_URL, metrics_interval_s=0.05)
    load = synthetic_workload(settings, 2, 0.002, output_scale=0.004)
    server = FakeServer(lambda chat: Reply(" tok" * 20, completion_tokens=20,
                                           token_delay_s=0.002, finish_reason="length"),
                        capacity=2)
    result = await run_bench(settings, sqlite_engine, load, name="synthetic",
                             strategies=["fixed-1", "fixed-2", "flood", "adaptive"],
                             http_client=server.client())
    arms = {a["strategy"]: a for a in result.arms}
    assert all(a["calls"] == 34 and a["completion_tokens"] == 34 * 20 for a in arms.values())
    assert result.ceiling_arm in ("fixed-2", "flood")
    # The bounds leave room for a shared machine's noise between arms (about a fifth).
    assert 0.2 <= arms["fixed-1"]["ratio_to_ceiling"] <= 0.75
    # Flooding past the server's two places buys nothing (32 requests only wait, and this
    # process juggles 34 streams): the ceiling is the server's. Unbounded, flood measured
    # 3.7x fixed-2 here.
    flood_gain = arms["flood"]["output_tokens_per_s"] / arms["fixed-2"]["output_tokens_per_s"]
    assert flood_gain <= 1.5
    # The adaptive arm reads the gauges and keeps the server nearly as full as fixed-2 does
    # (leaving it half idle, as fixed-1 does, would reach under half of the ceiling).
    assert arms["adaptive"]["ratio_to_ceiling"] >= 0.7
    assert server.load.max_in_flight == 34 and server.load.max_waiting == 34 - 2  # flood
    # Each arm paced as named: one ticker at a time sends at most its four analysts.
    assert _max_overlap(sqlite_engine, arms["fixed-1"]["batch_id"]) <= 4
    # Per-arm cache salts: no arm can reuse another arm's prefix cache.
    salts = {c.body.get("cache_salt") for c in server.chats}
    assert len(salts) == 4
