"""Check the batch report: exact JSON keys, batch-level throughput, the CLI and its errors."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from pydantic_core import to_jsonable_python
from rich.console import Console
from sqlalchemy import Engine, update

from app.cli.report import compare_table, endpoint_table, render_table
from app.config import load_settings
from app.db.models import Batch, LLMCall, ServerSample
from app.errors import InputError
from app.morning.accounting import batch_report, compare_arm, endpoint_shares, throughput
from app.morning.activity import ActiveTime, active_time
from app.morning.digest import build_digest
from app.morning.serverview import server_view
from tests.unit.support.call_rows import T0, add_call, known_batch, new_batch
from tests.unit.support.clirun import nightdesk, run_cli
from tests.unit.support.webclient import AUTH

KEYS = {"batch_id", "calls", "attempts", "failed_attempts", "prompt_tokens", "completion_tokens",
        "first_call_start", "last_call_end", "wall_seconds", "output_tokens_per_s", "nodes",
        "metrics_fallback", "succeeded_completion_tokens", "succeeded_output_tokens_per_s",
        "active_seconds", "paused_seconds", "pauses", "brief"}


def add_sample(engine: Engine, batch_id: int, at_s: float, *, prefill_s: float | None,
               decode_s: float | None) -> None:
    """Insert one server_samples row taken ``at_s`` after T0 with the given request times."""
    with engine.begin() as conn:
        conn.execute(ServerSample.__table__.insert().values(  # type: ignore[attr-defined]
            batch_id=batch_id, sampled_at=T0 + timedelta(seconds=at_s), running=1.0,
            waiting=0.0, kv_cache_usage=0.1, preemptions_total=0.0, prompt_tokens_total=0.0,
            generation_tokens_total=0.0, prefill_time_s_total=prefill_s,
            decode_time_s_total=decode_s))


def test_server_view_splits_request_time_into_prefill_and_decode(
        sqlite_engine: Engine) -> None:
    b = known_batch(sqlite_engine)
    # The server had run before the batch: only the increase over it counts.
    add_sample(sqlite_engine, b, 0.0, prefill_s=100.0, decode_s=1000.0)
    add_sample(sqlite_engine, b, 60.0, prefill_s=138.0, decode_s=1540.0)
    view = server_view(sqlite_engine, b)
    assert view.prefill_time_s == pytest.approx(38.0)
    assert view.decode_time_s == pytest.approx(540.0)
    assert view.decode_time_share == pytest.approx(540.0 / 578.0)  # the seeds' ~93%
    assert compare_arm(sqlite_engine, b).decode_time_share == pytest.approx(540.0 / 578.0)
    console = Console(width=200, record=True)
    render_table(batch_report(sqlite_engine, b), view, console)
    assert "prefill 38.0 s, decode 540.0 s (decode 93%)" in console.export_text()
    console.print(compare_table([compare_arm(sqlite_engine, b)]))
    assert "decode share" in console.export_text()


def test_server_view_request_time_is_unknown_without_the_histograms(
        sqlite_engine: Engine) -> None:
    older = known_batch(sqlite_engine)
    add_sample(sqlite_engine, older, 0.0, prefill_s=None, decode_s=None)
    add_sample(sqlite_engine, older, 60.0, prefill_s=None, decode_s=None)
    view = server_view(sqlite_engine, older)
    assert (view.prefill_time_s, view.decode_time_s, view.decode_time_share) == (
        None, None, None)
    # No request finished between the readings: zero seconds each, and no share to give.
    idle = known_batch(sqlite_engine)
    add_sample(sqlite_engine, idle, 0.0, prefill_s=5.0, decode_s=9.0)
    add_sample(sqlite_engine, idle, 60.0, prefill_s=5.0, decode_s=9.0)
    view = server_view(sqlite_engine, idle)
    assert (view.prefill_time_s, view.decode_time_s, view.decode_time_share) == (
        0.0, 0.0, None)


def add_prefix_sample(engine: Engine, batch_id: int, at_s: float, prompt: float,
                      queries: float, hits: float) -> None:
    with engine.begin() as conn:
        conn.execute(ServerSample.__table__.insert().values(  # type: ignore[attr-defined]
            batch_id=batch_id, sampled_at=T0 + timedelta(seconds=at_s), running=14.0,
            waiting=3.0, kv_cache_usage=1.0, preemptions_total=0.0,
            prompt_tokens_total=prompt, generation_tokens_total=0.0,
            prefix_cache_queries_total=queries, prefix_cache_hits_total=hits))


def test_prefix_counters_that_count_repeated_lookups_give_no_hit_rate(
        sqlite_engine: Engine) -> None:
    # Counters of an H200 arm (fixed-14, 40 tickers) whose requests queued at a full cache:
    # 6.6 M lookups for 1.5 M prompt tokens, so its 1.0 M "hits" are mostly repeats.
    crowded = known_batch(sqlite_engine)
    add_prefix_sample(sqlite_engine, crowded, 0.0, 0.0, 0.0, 0.0)
    add_prefix_sample(sqlite_engine, crowded, 60.0, 1_503_120.0, 6_642_576.0, 1_016_080.0)
    view = server_view(sqlite_engine, crowded)
    assert view.prefix_lookups_per_prompt_token == pytest.approx(4.42, abs=0.01)
    assert view.prefix_cache_hit_rate is None and view.prefill_tokens_computed is None
    console = Console(width=250, record=True)
    render_table(batch_report(sqlite_engine, crowded), view, console)
    assert "looked prompts up 4.4× per prompt token" in console.export_text()
    # The adaptive arm of the same run never queued at a full cache: one lookup per token.
    calm = known_batch(sqlite_engine)
    add_prefix_sample(sqlite_engine, calm, 0.0, 0.0, 0.0, 0.0)
    add_prefix_sample(sqlite_engine, calm, 60.0, 1_503_120.0, 1_503_120.0, 329_008.0)
    view = server_view(sqlite_engine, calm)
    assert view.prefix_cache_hit_rate == pytest.approx(0.2189, abs=1e-4)
    assert view.prefill_tokens_computed == 1_503_120.0 - 329_008.0
    assert compare_arm(sqlite_engine, calm).prefix_lookups_per_prompt_token == 1.0


def test_report_json_has_exactly_the_documented_keys(sqlite_engine: Engine) -> None:
    data = to_jsonable_python(batch_report(sqlite_engine, known_batch(sqlite_engine)))
    assert set(data) == KEYS
    for node in data["nodes"]:
        assert {"node", "attempts", "mean_s", "p50_s", "p99_s"} <= set(node)


def test_throughput_is_completion_tokens_over_the_makespan(sqlite_engine: Engine) -> None:
    b = known_batch(sqlite_engine)
    r = to_jsonable_python(batch_report(sqlite_engine, b))
    assert r["batch_id"] == b
    # Calls answered (a node of a sample of a ticker, once, as the ETA counts them) apart
    # from attempts: the analyst's call answered twice, the trader's after one failure.
    assert (r["calls"], r["attempts"], r["failed_attempts"]) == (2, 4, 1)
    assert (r["prompt_tokens"], r["completion_tokens"]) == (400, 1000)
    assert datetime.fromisoformat(r["first_call_start"]) == T0 + timedelta(seconds=10)
    assert datetime.fromisoformat(r["last_call_end"]) == T0 + timedelta(seconds=50)
    assert r["wall_seconds"] == pytest.approx(40.0)
    # 1000 / 40, not the mean of per-call speeds (which would be far higher).
    assert r["output_tokens_per_s"] == pytest.approx(25.0)
    nodes = {n["node"]: n for n in r["nodes"]}
    assert nodes["analyst"]["attempts"] == 2
    assert nodes["analyst"]["mean_s"] == pytest.approx(3.0)
    assert nodes["analyst"]["p50_s"] == pytest.approx(3.0)
    assert nodes["trader"]["p99_s"] == pytest.approx(1 + 0.99 * 24)


def resumed_batch(engine: Engine) -> int:
    """Insert a night that ran 100 s, stood still 2 hours, and ran 100 s more once resumed:
    two overlapping calls of 4,000 output tokens in each run (16,000 tokens in 200 s)."""
    b = new_batch(engine)
    for start in (0.0, 7_300.0):
        add_call(engine, b, "analyst", 1, start, start + 100, prompt=10, completion=4_000)
        add_call(engine, b, "trader", 1, start + 20, start + 80, prompt=10, completion=4_000)
    return b


def test_a_resumed_nights_throughput_leaves_its_pause_out(sqlite_engine: Engine) -> None:
    b = resumed_batch(sqlite_engine)
    report = batch_report(sqlite_engine, b)
    rate = throughput(sqlite_engine, b)
    # 16,000 / 200 s, not over the 7,400 s makespan (2.2 tok/s); the pause shown apart.
    assert (report.wall_seconds, report.active_seconds, report.paused_seconds,
            report.pauses) == (7_400.0, 200.0, 7_200.0, 1)
    assert report.output_tokens_per_s == pytest.approx(80.0)
    assert (rate.output_tokens_per_s, rate.active_seconds, rate.paused_seconds, rate.pauses) \
        == (pytest.approx(80.0), 200.0, 7_200.0, 1)


def test_cli_report_names_the_pause_apart(sqlite_engine: Engine) -> None:
    b = resumed_batch(sqlite_engine)
    shown = run_cli("report", str(b), env={"COLUMNS": "200"}).stdout
    assert re.search(r"active seconds[\s│]+200\.0", shown)
    assert re.search(r"paused seconds[\s│]+7200\.0 \(1 pause, not in tok/s\)", shown)
    assert re.search(r"batch output tok/s[\s│]+80\.0", shown)


def test_gaps_under_a_minute_are_the_nights_own_work_not_pauses() -> None:
    at = [(T0, T0 + timedelta(seconds=10)),
          (T0 + timedelta(seconds=69), T0 + timedelta(seconds=80)),  # 59 s after: bridged
          (T0 + timedelta(seconds=140), T0 + timedelta(seconds=150))]  # 60 s: a pause
    assert active_time(at) == ActiveTime(150.0, 90.0, 60.0, 1)
    assert active_time([]) == ActiveTime(0.0, 0.0, 0.0, 0)


def test_a_stop_under_a_minute_before_its_resume_is_a_pause_all_the_same(
        sqlite_engine: Engine) -> None:
    # SIGTERM, then `run --resume` at once: the night stood still 30 s, which a minute's
    # threshold alone took for its own work. The resume the batch records says it stopped.
    b = new_batch(sqlite_engine)
    add_call(sqlite_engine, b, "analyst", 1, 0, 100, prompt=10, completion=4_000)
    add_call(sqlite_engine, b, "trader", 1, 110, 140, prompt=10, completion=4_000)  # own work
    add_call(sqlite_engine, b, "analyst", 2, 170, 270, prompt=10, completion=4_000)
    with sqlite_engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == b).values(settings={
            "resumes": [(T0 + timedelta(seconds=155)).isoformat()]}))
    report = batch_report(sqlite_engine, b)
    assert (report.wall_seconds, report.active_seconds, report.paused_seconds,
            report.pauses) == (270.0, 240.0, 30.0, 1)
    assert report.output_tokens_per_s == pytest.approx(12_000 / 240)
    # Without a resume in it, a gap under a minute stays the night's own work.
    assert active_time([(T0, T0 + timedelta(seconds=10)),
                        (T0 + timedelta(seconds=40), T0 + timedelta(seconds=50))],
                       [T0 + timedelta(seconds=60)]) == ActiveTime(50.0, 50.0, 0.0, 0)


def test_an_empty_batch_reports_zeros(sqlite_engine: Engine) -> None:
    r = to_jsonable_python(batch_report(sqlite_engine, new_batch(sqlite_engine)))
    assert r["calls"] == 0 and r["output_tokens_per_s"] == 0.0 and r["nodes"] == []


def test_an_unknown_batch_is_an_input_error(sqlite_engine: Engine) -> None:
    with pytest.raises(InputError, match="no batch with id 999"):
        batch_report(sqlite_engine, 999)


def test_cli_report_prints_json(
    sqlite_engine: Engine, sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The isolated_env fixture puts NIGHTDESK_HOME in tmp_path: the database is the same file.
    assert load_settings().store.database_url == sqlite_url
    b = known_batch(sqlite_engine)
    code, out, err = nightdesk(monkeypatch, capsys, "report", str(b), "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    # The report's own keys exactly; the CLI adds the batch's head, failed tickers and the
    # commands advised, the server's view, each endpoint's part (here the one endpoint the
    # rows do not name), the night against its graph bound and the warnings beside.
    assert set(data) - {"batch", "failed_tickers", "advice", "server", "endpoints",
                        "over_time", "graph_bound", "warnings"} == KEYS
    # These rows recorded no requests: no chains to bound, and the report says so.
    assert data["graph_bound"]["bound_s"] is None and data["graph_bound"]["unavailable"]
    assert [e["endpoint"] for e in data["endpoints"]] == [None]
    assert data["warnings"] == []
    assert data["output_tokens_per_s"] == pytest.approx(25.0)
    # The 40 s makespan in 10 s intervals, oldest first, the last ending at the last answer.
    assert [(i["start_s"], i["end_s"]) for i in data["over_time"]] == [
        (0.0, 10.0), (10.0, 20.0), (20.0, 30.0), (30.0, 40.0)]
    assert {"prefill_time_s", "decode_time_s", "decode_time_share"} <= set(data["server"])
    # Without an id the newest batch is reported.
    code, out, _ = nightdesk(monkeypatch, capsys, "report", "--format", "json")
    assert code == 0 and json.loads(out)["batch_id"] == b


def test_cli_report_of_a_missing_batch_is_one_line_and_exit_2(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    known_batch(sqlite_engine)
    code, out, err = nightdesk(monkeypatch, capsys, "report", "424242", "--format", "json")
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "no batch with id 424242" in lines[0]
    assert "Traceback" not in err


def test_server_counters_are_summed_across_a_restart() -> None:
    from app.morning.serverview import counter_delta

    # 100 -> 160 (+60), restart: the counter starts again at 0 and reads 25 (+25), -> 40 (+15).
    assert counter_delta([100.0, 160.0, 25.0, 40.0]) == 60 + 25 + 15
    assert counter_delta([None, 5.0, None, 9.0]) == 4  # unread samples are skipped
    assert counter_delta([7.0]) is None  # one reading says nothing about an increase
GPU0, GPU1 = "http://h:8000/v1", "http://h:8001/v1"


def two_endpoint_batch(engine: Engine) -> int:
    """Insert a batch served by two endpoints, with counters whose increases are known.

    GPU0: 3 calls, 600 output tokens; its counters rise 100 -> 700 generation tokens, KV
    peaks at 0.4, one preemption. GPU1: 2 calls (one failed), 400 tokens; it restarted
    mid-batch (its counter falls from 300 to 50), so its increase is 250 + 50 = 300.
    """
    b = new_batch(engine)
    calls = [(GPU0, "a", 0.0, 10.0, 200), (GPU0, "b", 10.0, 20.0, 200),
             (GPU0, "c", 20.0, 40.0, 200), (GPU1, "a", 0.0, 5.0, None),
             (GPU1, "b", 5.0, 30.0, 400)]
    with engine.begin() as conn:
        for i, (url, node, start, end, completion) in enumerate(calls):
            conn.execute(LLMCall.__table__.insert().values(  # type: ignore[attr-defined]
                batch_id=b, ticker="AAPL" if url == GPU0 else "MSFT", node=node, sample=0,
                attempt=1 + i, model="m", prompt_tokens=10, completion_tokens=completion,
                status="ok" if completion else "error", endpoint=url,
                started_at=T0 + timedelta(seconds=start), ended_at=T0 + timedelta(seconds=end),
                latency_s=end - start))
        readings = [(GPU0, 0, 2, 0.1, 0, 100), (GPU0, 20, 4, 0.4, 1, 400),
                    (GPU0, 40, 0, 0.2, 1, 700), (GPU1, 1, 1, 0.3, 0, 50),
                    (GPU1, 21, 3, 0.6, 0, 300), (GPU1, 41, 1, 0.1, 0, 50)]
        for url, at, running, kv, preempted, generated in readings:
            conn.execute(ServerSample.__table__.insert().values(  # type: ignore[attr-defined]
                batch_id=b, sampled_at=T0 + timedelta(seconds=at), running=running,
                waiting=0.0, kv_cache_usage=kv, preemptions_total=preempted,
                prompt_tokens_total=0.0, generation_tokens_total=generated, endpoint=url))
    return b


def test_each_endpoints_share_and_the_batch_total(sqlite_engine: Engine) -> None:
    b = two_endpoint_batch(sqlite_engine)
    shares = {s.endpoint: s for s in endpoint_shares(sqlite_engine, b)}
    assert list(shares) == [GPU0, GPU1]
    gpu0, gpu1 = shares[GPU0], shares[GPU1]
    assert (gpu0.calls, gpu0.attempts, gpu0.failed_attempts, gpu0.completion_tokens) == \
        (3, 3, 0, 600)
    assert (gpu1.calls, gpu1.attempts, gpu1.failed_attempts, gpu1.completion_tokens) == \
        (1, 2, 1, 400)
    # Over the batch's 40 s makespan, so the endpoints add up to the batch's 25 tok/s.
    assert gpu0.output_tokens_per_s == pytest.approx(15.0)
    assert gpu1.output_tokens_per_s == pytest.approx(10.0)
    assert (gpu0.kv_usage_max, gpu0.preemptions) == (pytest.approx(0.4), 1.0)
    assert (gpu1.kv_usage_max, gpu1.preemptions) == (pytest.approx(0.6), 0.0)
    assert gpu0.running_mean == pytest.approx(2.0) and gpu1.running_mean == pytest.approx(5 / 3)
    # The total adds each endpoint's own series, never one mixed series: GPU1's restart
    # counts as a reset of its counter only.
    view = server_view(sqlite_engine, b)
    assert view.generation_tokens == pytest.approx(600 + 300)
    assert view.preemptions == 1.0 and view.kv_usage_max == pytest.approx(0.6)
    assert view.running_mean == pytest.approx(2.0 + 5 / 3)
    assert view.running_max == pytest.approx(4 + 3) and view.running_p50 is None
    assert server_view(sqlite_engine, b, GPU1).generation_tokens == pytest.approx(300)
    console = Console(width=200, record=True)
    console.print(endpoint_table(list(shares.values()), batch_report(sqlite_engine, b), view))
    text = console.export_text()
    assert GPU0 in text and GPU1 in text and "batch total" in text and "25.0" in text
    assert [e.endpoint for e in compare_arm(sqlite_engine, b).endpoints] == [GPU0, GPU1]


def test_calls_and_attempts_are_said_alike_in_the_report_the_page_and_the_digest(
        sqlite_engine: Engine, client: TestClient) -> None:
    """Before, the report's "calls" counted attempts while the ETA counted answered calls;
    now each surface gives both, under the same names."""
    b = known_batch(sqlite_engine)
    said = "2 calls (4 attempts, 1 failed)"
    with sqlite_engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == b).values(kind="nightly",
                                                               status="succeeded"))
    assert said in build_digest(sqlite_engine, load_settings(), b).message.body
    page = re.sub(r"<[^>]+>", "", client.get(f"/batches/{b}", auth=AUTH).text)
    assert said in " ".join(page.split())
    table = run_cli("report", str(b), env={"COLUMNS": "200"}).stdout
    assert re.search(r"│ calls\s+│ 2\s+│", table) and re.search(r"│ attempts\s+│ 4\s+│", table)
    assert re.search(r"│ failed attempts\s+│ 1\s+│", table), table


def test_one_call_is_said_in_the_singular_on_the_digest_and_the_page(
        sqlite_engine: Engine, client: TestClient) -> None:
    # It said "1 calls (1 attempts, 0 failed)".
    b = new_batch(sqlite_engine)
    add_call(sqlite_engine, b, "analyst", 1, 10.0, 12.0, prompt=100, completion=200)
    with sqlite_engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == b).values(kind="nightly",
                                                               status="succeeded"))
    said = "1 call (1 attempt, 0 failed)"
    assert said in build_digest(sqlite_engine, load_settings(), b).message.body
    page = re.sub(r"<[^>]+>", "", client.get(f"/batches/{b}", auth=AUTH).text)
    assert said in " ".join(page.split())
