"""``nightdesk plan``: the planned makespan and the graph bound per endpoint count, its
deadline answer, its bad input."""

from __future__ import annotations

import csv
import io
import itertools
import json
from typing import Any

import pytest

from app.bench.plan import H200_MOE, Admission, plan_fleet, synthetic_shape
from tests.unit.support.clirun import run_cli

# The production shape by hand (app/bench/workloads.py): 17 calls of 1,500 output tokens;
# prompts 4 x 4,000 (analysts) and 13 from 6,000 to 20,000 (sum 169,000): 185,000 in all.
# KV-token-steps a ticker: 1,500 x 185,000 + 17 x 1,500^2 / 2 = 296,625,000. The longest chain:
# an analyst and the 13 downstream nodes, 14 x 1,500 = 21,000 tokens.
OUTPUT_PER_TICKER = 17 * 1_500
KV_STEPS_PER_TICKER = 1_500 * 185_000 + 17 * 1_500**2 / 2
CRITICAL = 14 * 1_500


def by_hand(tickers: int, endpoints: int, kv_tokens: int = 1_488_240) -> float:
    """The bound's makespan on H200s (20 ms + 0.2 ms per running request), worked out here."""
    output = tickers * OUTPUT_PER_TICKER
    steps = max(output / (256 * endpoints),
                tickers * KV_STEPS_PER_TICKER / (kv_tokens * endpoints), CRITICAL)
    return 0.020 * steps + 0.0002 * output / endpoints


ADMITTED_KV = 1_339_416  # 0.90 (the token budget's kv_high) of the H200's cache


def plan_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_cli("plan", *args, "--format", "json", env=env)
    assert result.code == 0, result.stderr
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


def test_plan_gives_the_bound_for_every_fleet_from_1_to_16() -> None:
    plan = plan_json("--tickers", "500")
    rows = plan["rows"]
    assert [r["endpoints"] for r in rows] == list(range(1, 17))
    for row in rows:
        assert row["bound_s"] == pytest.approx(by_hand(500, row["endpoints"]), rel=1e-9)
        # The busiest endpoint's whole tickers: 500 over 3 is 167 on one of them.
        assert row["makespan_s"] == pytest.approx(
            by_hand(-(-500 // row["endpoints"]), 1, ADMITTED_KV) + row["ramp_s"], rel=1e-9)
    # One H200: the KV cache sets the bound (75.7 min); admitted to 90% of it, 12,750,000
    # tokens in 110,729 steps keep 115.1 requests running, which the request limit reaches
    # from 4 in five doublings, 2 s apart (the default reading interval): lost 2 x (5 -
    # (4 + 8 + 16 + 32 + 64) / 115.1) = 7.85 s. Eight: the 21,000-token chain (12.3 min).
    assert rows[0]["binding"] == "kv_cache"
    assert rows[0]["bound_s"] == pytest.approx(4543.1, abs=0.1)
    assert rows[0]["ramp_s"] == pytest.approx(7.85, abs=0.01)
    assert rows[0]["makespan_s"] == pytest.approx(4772.4, abs=0.1)
    assert rows[7]["binding"] == "critical_path"
    assert rows[7]["bound_s"] == pytest.approx(738.75)
    spans = [r["makespan_s"] for r in rows]
    assert all(later <= earlier for earlier, later in itertools.pairwise(spans))
    # A bound the cache sets uses all of the summed capacity; past it, less and less.
    assert rows[0]["share_of_summed_capacity"] == pytest.approx(1.0)
    assert rows[15]["share_of_summed_capacity"] < rows[7]["share_of_summed_capacity"] < 0.8
    # 16 endpoints, 32 tickers on the busiest: 588.1 s; within 5% (617.5 s): 14 (608.9 s)
    # but not 13 (624.4 s).
    assert plan["best_makespan_s"] == pytest.approx(rows[15]["makespan_s"])
    assert plan["best_makespan_s"] == pytest.approx(588.1, abs=0.1)
    assert plan["smallest_within_5pct"] == 14
    assert [r["within_5pct_of_best"] for r in rows] == [False] * 13 + [True] * 3
    assert plan["deadline"] is None


def test_plan_never_rises_with_more_endpoints_whatever_the_size() -> None:
    # More endpoints: no more steps at the admitted cache, no more requests to ramp up to.
    for tickers, out, reading in itertools.product((1, 7, 60, 114, 500, 2_000),
                                                   (0.05, 0.2, 1.0), (1.0, 2.0, 10.0)):
        rows = plan_fleet(tickers, synthetic_shape(out), H200_MOE,
                          Admission(reading_s=reading)).rows
        for spans in ([r.makespan_s for r in rows], [r.bound_s for r in rows]):
            assert all(b <= a for a, b in itertools.pairwise(spans)), (tickers, out, reading)


def test_plan_csv_has_the_json_rows() -> None:
    result = run_cli("plan", "--tickers", "120", "--format", "csv")
    assert result.code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    plan = plan_json("--tickers", "120")
    assert [int(r["endpoints"]) for r in rows] == list(range(1, 17))
    assert [float(r["makespan_s"]) for r in rows] == pytest.approx(
        [r["makespan_s"] for r in plan["rows"]])


def test_plan_table_names_the_smallest_fleet_and_the_endpoint() -> None:
    result = run_cli("plan", "--tickers", "500")
    assert result.code == 0, result.stderr
    assert "smallest fleet within 5% of the best" in result.stdout
    assert "14 endpoint(s)" in result.stdout and "1,488,240 KV tokens" in result.stdout


@pytest.mark.parametrize(("deadline", "endpoints"), [
    # The night starts at 00:00 UTC: by 00:15 (900 s) six H200s (853 s) but not five (961 s);
    # by 23:59 one (4,772 s); by 00:05 (300 s) no fleet of 16.
    ("00:15", 6), ("23:59", 1), ("00:05", None)])
def test_plan_answers_how_many_gpus_finish_by_a_deadline(deadline: str,
                                                         endpoints: int | None) -> None:
    env = {"NIGHTDESK_SCHEDULE_CRON": "0 0 * * *", "NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
    plan = plan_json("--tickers", "500", "--deadline", deadline, env=env)
    answer = plan["deadline"]
    assert answer["endpoints"] == endpoints
    assert answer["start"].endswith("T00:00:00Z") or answer["start"].endswith("T00:00:00+00:00")
    hours, minutes = map(int, deadline.split(":"))
    assert answer["seconds"] == (hours * 60 + minutes) * 60
    table = run_cli("plan", "--tickers", "500", "--deadline", deadline, env=env).stdout
    if endpoints is None:
        assert "no fleet of up to 16 endpoints finishes" in table
    else:
        assert f"at least {endpoints} endpoint(s) to finish" in table


@pytest.mark.parametrize(("args", "says"), [
    (("--tickers", "0"), "--tickers"),
    (("--tickers", "many"), "--tickers"),
    (("--tickers", "1" + "0" * 400), "--tickers"),
    (("--tickers", "1000001"), "--tickers"),
    (("--tickers", "5", "--shape", "weekly"), "--shape takes synthetic or a recorded night"),
    (("--tickers", "5", "--shape", "12x"), "--shape takes synthetic"),
    (("--tickers", "5", "--profile", "a100"), "--profile takes h200-moe or a recorded night"),
    (("--tickers", "5", "--shape", "424242"), "no batch with id 424242"),
    (("--tickers", "5", "--profile", "424242"), "no batch with id 424242"),
    (("--tickers", "5", "--deadline", "6:30"), "--deadline takes a 24-hour time HH:MM"),
    (("--tickers", "5", "--deadline", "25:00"), "--deadline takes a 24-hour time HH:MM"),
    (("--tickers", "5", "--deadline", "０６:３０"), "--deadline takes a 24-hour time HH:MM"),
    (("--tickers", "5", "--format", "xml"), "--format"),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], says: str) -> None:
    result = run_cli("plan", *args)
    assert result.code == 2
    assert len(result.error_lines) == 1 and says in result.error_lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


# --- a recorded night against its own bound (nightdesk report) ------------------------------


def _night(engine: Any, facts: dict[str, Any] | None, status: str = "succeeded",
           ticker_status: dict[str, str] | None = None, pause_s: float = 0.0) -> int:
    """Two tickers of a, b side by side (0-20 s) then c after both (20-40 s); outputs 10, 20,
    30 with prompts 100, 200, 300; the server read at 0, 20 and 40 s running 2, 60 tokens
    made between readings. ``ticker_status``: ticker runs recorded with these statuses (a
    ticker not succeeded made only a and b: its c never ran). ``pause_s``: the night stood
    still this long between b and c (crashed, then resumed), its last reading as late."""
    from datetime import UTC, date, datetime, timedelta

    from sqlalchemy.orm import Session

    from app.db.models import Batch, LLMCall, LLMRequest, ServerSample, TickerRun
    from app.usage import compress_body

    t0 = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)
    with Session(engine) as session:
        ticker_status = ticker_status or {}
        succeeded = sum(1 for t in ("X", "Y") if ticker_status.get(t, "succeeded") == "succeeded")
        batch = Batch(kind="nightly", as_of=date(2026, 12, 1), status=status,
                      created_at=t0, started_at=t0,
                      finished_at=None if status == "running" else t0 + timedelta(seconds=40),
                      # a live process's heartbeat: the night reads running, not crashed
                      heartbeat_at=datetime.now(UTC) if status == "running" else None,
                      settings={}, server_facts=facts, tickers_total=2,
                      tickers_succeeded=succeeded)
        session.add(batch)
        session.flush()
        for ticker in ("X", "Y"):
            done = ticker_status.get(ticker, "succeeded") == "succeeded"
            if ticker in ticker_status:
                session.add(TickerRun(batch_id=batch.id, ticker=ticker,
                                      status=ticker_status[ticker]))
            for node, prompt, out, start in (("a", 100, 10, 0), ("b", 200, 20, 0),
                                             ("c", 300, 30, 20))[:3 if done else 2]:
                call_id = f"{batch.id}-{ticker}-{node}"
                session.add(LLMRequest(batch_id=batch.id, ticker=ticker, node=node, sample=0,
                                       call_id=call_id,
                                       body=compress_body({"messages": [], "max_tokens": out})))
                session.add(LLMCall(
                    batch_id=batch.id, ticker=ticker, node=node, sample=0, call_id=call_id,
                    model="m", prompt_tokens=prompt, completion_tokens=out, status="ok",
                    started_at=t0 + timedelta(seconds=start + (pause_s if start else 0)),
                    ended_at=t0 + timedelta(seconds=start + 20 + (pause_s if start else 0)),
                    latency_s=20.0))
        # (seconds, tokens made so far) at each reading; a pause adds the first reading after
        # the resume, which finds no tokens made since the last one before it.
        readings = [(0, 0), (20, 60), (40, 120)] if not pause_s else [
            (0, 0), (20, 60), (20 + pause_s, 60), (40 + pause_s, 120)]
        for at, made in readings:
            session.add(ServerSample(
                batch_id=batch.id, sampled_at=t0 + timedelta(seconds=at), running=2,
                waiting=0, kv_cache_usage=0.1, preemptions_total=0, prompt_tokens_total=0,
                generation_tokens_total=made, endpoint="http://gpu:8000/v1"))
        session.commit()
        return batch.id


def test_a_night_is_set_against_its_own_graph_bound(sqlite_engine: Any) -> None:
    from app.bench.plan import night_bound

    night = _night(sqlite_engine, {"kv_cache_tokens": 10_000, "max_num_seqs": 4})
    bound = night_bound(sqlite_engine, night, 40.0)
    # By hand: 120 output tokens at running 2 over 40 s is 60 steps, 2/3 s a step (one level:
    # no growth term). Steps: output / seqs 30, KV-token-steps 2 x 14,700 / 10,000 = 2.94, the
    # chain b then c 50 tokens: 50 steps, 33.3 s; the night took 40 s, 1.2 x.
    assert bound.binding == "critical_path" and bound.endpoints == 1
    assert bound.bound_s == pytest.approx(100 / 3)
    assert bound.makespan_over_bound == pytest.approx(1.2)
    shown = run_cli("report", str(night))
    assert shown.code == 0, shown.stderr
    assert "graph bound: makespan 40 s = 1.20 x the least" in shown.stdout
    assert json.loads(run_cli("report", str(night), "--format", "json").stdout)[
        "graph_bound"]["makespan_over_bound"] == pytest.approx(1.2)
    # A night quicker than the model's bound shows the model wrong for it: no ratio is
    # called a bound (the figures stay in the JSON).
    quick = night_bound(sqlite_engine, night, 30.0)
    assert quick.bound_s == pytest.approx(100 / 3) and quick.makespan_over_bound < 1
    assert quick.unavailable is not None and "bounds nothing" in quick.unavailable
    from app.cli.report import bound_line
    assert bound_line(quick).startswith("graph bound: none for this night (the model gives 33 s")
    assert "x the least" not in bound_line(quick)
    # Without the server's KV cache size the bound is not computed, and the report says why.
    bare = _night(sqlite_engine, None)
    assert night_bound(sqlite_engine, bare, 40.0).unavailable is not None
    line = run_cli("report", str(bare)).stdout
    assert "graph bound: not computed" in line and "recorded no KV cache size" in line
    assert "--profile" not in line  # plan's advice, no report's


def test_plan_takes_a_recorded_nights_shape_and_server(sqlite_engine: Any) -> None:
    night = _night(sqlite_engine, {"kv_cache_tokens": 10_000, "max_num_seqs": 4})
    plan = plan_json("--tickers", "4", "--shape", str(night), "--profile", str(night))
    # The mean ticker: 60 output tokens, 14,700 KV-token-steps, its chain 50 tokens; the
    # server: 10,000 KV tokens, 4 sequences, 2/3 s a step. 4 tickers on one endpoint: 240
    # tokens at 4 a step, 60 steps (40 s); on two the chain's 50 steps (33.3 s) set it.
    assert plan["shape"]["output_tokens"] == 60 and plan["shape"]["critical_path_tokens"] == 50
    assert plan["profile"]["kv_tokens"] == 10_000 and plan["profile"]["max_num_seqs"] == 4
    one, two = plan["rows"][0], plan["rows"][1]
    assert (one["binding"], one["makespan_s"]) == ("max_num_seqs", pytest.approx(40.0))
    assert (two["binding"], two["makespan_s"]) == ("critical_path", pytest.approx(100 / 3))
    assert plan["smallest_within_5pct"] == 2
    # A night that recorded no KV cache size cannot be a profile: one line, exit 2.
    bare = _night(sqlite_engine, None)
    refused = run_cli("plan", "--tickers", "4", "--profile", str(bare))
    assert refused.code == 2 and "recorded no KV cache size" in refused.error_lines[0]
    assert "plan with a built-in --profile, e.g. --profile h200-moe" in refused.error_lines[0]


# --- checked from outside (issue 46's QA): nights that did not end well, odd clocks ---------

FACTS = {"kv_cache_tokens": 10_000, "max_num_seqs": 4}



def _noisy_night(sqlite_engine: Any, levels: list[int]) -> int:
    """Return a night whose readings run at ``levels`` running requests, one interval each,
    each interval's tokens 10% off the step's line one way or the other: a fit that is not
    sure of itself."""
    from datetime import timedelta

    from sqlalchemy import delete, select
    from sqlalchemy.orm import Session

    from app.db.models import ServerSample

    night = _night(sqlite_engine, {"kv_cache_tokens": 10_000, "max_num_seqs": 4})
    with Session(sqlite_engine) as session:
        first = session.scalars(select(ServerSample).where(
            ServerSample.batch_id == night).order_by(ServerSample.sampled_at)).first()
        assert first is not None
        t0, endpoint = first.sampled_at, first.endpoint
        session.execute(delete(ServerSample).where(ServerSample.batch_id == night))
        made, at = 0, 0.0
        for i, running in enumerate(levels):
            session.add(ServerSample(
                batch_id=night, sampled_at=t0 + timedelta(seconds=at), running=running,
                waiting=0, kv_cache_usage=0.1, preemptions_total=0, prompt_tokens_total=0,
                generation_tokens_total=made, endpoint=endpoint))
            at += 3.0
            made += round(3.0 / (0.2 + 0.05 * running) * running * (1.1 if i % 2 else 0.9))
        session.commit()
    return night


def test_a_nights_bound_says_how_sure_its_fitted_step_is(sqlite_engine: Any) -> None:
    from app.bench.bound import MIN_INTERVAL_LEVELS
    from app.bench.plan import night_bound
    from app.cli.report import bound_line

    # Each level twice in a row: an interval between two readings is at their mean running.
    levels = [r for r in range(1, MIN_INTERVAL_LEVELS + 2) for _ in (0, 1)]
    bound = night_bound(sqlite_engine, _noisy_night(sqlite_engine, levels), 40.0)
    assert bound.makespan_over_bound is not None and bound.makespan_over_bound_90 is not None
    low, high = bound.makespan_over_bound_90
    assert low < bound.makespan_over_bound < high
    assert f"90% interval {low:.2f}–{high:.2f} x" in bound_line(bound)
    # One level of readings (the plain night) leaves nothing to resample: no interval.
    plain = night_bound(sqlite_engine, _night(sqlite_engine, {"kv_cache_tokens": 10_000,
                                                              "max_num_seqs": 4}), 40.0)
    assert plain.makespan_over_bound_90 is None and "90% interval" not in bound_line(plain)


def test_a_bound_fitted_to_few_levels_gives_no_interval_and_says_why(sqlite_engine: Any) -> None:
    # Readings at 1 to 4 running requests: the expanded percentile bootstrap of the two-term
    # fit over 4 levels held the true bound on 86% of draws at 30% noise, not the 90% it
    # would say (docs/lab/2026-12-07-verdicts-outside-4.md).
    from app.bench.plan import night_bound
    from app.cli.report import bound_line

    bound = night_bound(sqlite_engine, _noisy_night(
        sqlite_engine, [1, 1, 2, 2, 3, 3, 4, 4, 1, 2, 3, 4]), 40.0)
    assert bound.makespan_over_bound is not None and bound.makespan_over_bound_90 is None
    line = bound_line(bound)
    assert "90% interval" not in line
    assert "no interval (the night's readings have fewer than 5 levels" in line


def test_a_bound_fitted_to_five_levels_gives_its_interval(sqlite_engine: Any) -> None:
    # From 5 levels the expanded interval holds its 90% (92.9-97.3% of 2,000 draws at 10% and
    # 30% noise, docs/lab/2026-12-07-verdicts-outside-4.md); it was withheld below 12.
    from app.bench.plan import night_bound
    from app.cli.report import bound_line

    levels = [r for r in range(1, 6) for _ in (0, 1)]
    bound = night_bound(sqlite_engine, _noisy_night(sqlite_engine, levels), 40.0)
    assert bound.makespan_over_bound_90 is not None
    assert "90% interval" in bound_line(bound)

def test_a_night_still_running_gives_no_shape_and_no_bound_yet(sqlite_engine: Any) -> None:
    night = _night(sqlite_engine, FACTS, status="running", ticker_status={"X": "running"})
    refused = run_cli("plan", "--tickers", "4", "--shape", str(night))
    assert refused.code == 2 and len(refused.error_lines) == 1
    assert f"batch {night} is still running" in refused.error_lines[0]
    shown = run_cli("report", str(night))
    assert shown.code == 0, shown.stderr
    assert f"graph bound: not computed (batch {night} is still running" in shown.stdout
    bound = json.loads(run_cli("report", str(night), "--format", "json").stdout)["graph_bound"]
    assert bound["makespan_over_bound"] is None and "still running" in bound["unavailable"]


def test_a_night_whose_tickers_all_failed_gives_no_shape(sqlite_engine: Any) -> None:
    night = _night(sqlite_engine, FACTS, status="failed",
                   ticker_status={"X": "failed", "Y": "failed"})
    refused = run_cli("plan", "--tickers", "4", "--shape", str(night))
    assert refused.code == 2 and len(refused.error_lines) == 1
    assert "no ticker succeeded" in refused.error_lines[0]
    # Its server still has a KV cache and readings: it may serve as a profile (for a shape
    # whose calls fit its 10,000 KV tokens: a whole night's).
    whole = _night(sqlite_engine, FACTS)
    assert run_cli("plan", "--tickers", "4", "--shape", str(whole), "--profile",
                   str(night)).code == 0


def test_a_partial_nights_shape_is_its_succeeded_tickers(sqlite_engine: Any) -> None:
    # Y failed after its first two calls: a mean over both tickers would be 45 output tokens,
    # three quarters of a whole ticker. X alone is the night's shape: 60 tokens, chain 50.
    night = _night(sqlite_engine, FACTS, status="partial",
                   ticker_status={"X": "succeeded", "Y": "failed"})
    plan = plan_json("--tickers", "4", "--shape", str(night))
    shape = plan["shape"]
    assert (shape["output_tokens"], shape["critical_path_tokens"], shape["tickers_seen"],
            shape["calls"]) == (60, 50, 1, 3)
    assert "1 succeeded ticker" in shape["name"]


def test_a_partial_nights_bound_says_it_is_of_its_answered_calls(sqlite_engine: Any) -> None:
    night = _night(sqlite_engine, FACTS, status="partial",
                   ticker_status={"X": "succeeded", "Y": "failed"})
    line = run_cli("report", str(night)).stdout
    assert "graph bound: makespan 40 s" in line
    assert "of its answered calls; 1 of 2 tickers did not succeed" in " ".join(line.split())


@pytest.mark.parametrize("text", ["+6:00", "6 :00", "06: 0", "06:00:00", "-1:00", "06-00"])
def test_deadline_is_two_digits_colon_two_digits(text: str) -> None:
    result = run_cli("plan", "--tickers", "5", "--deadline", text)
    assert result.code == 2 and "--deadline takes a 24-hour time HH:MM" in result.error_lines[0]


def test_a_deadline_across_a_clock_change_counts_real_seconds() -> None:
    from datetime import datetime, time
    from zoneinfo import ZoneInfo

    from app.bench.plan import answer_deadline

    berlin = ZoneInfo("Europe/Berlin")
    plan = plan_fleet(500, synthetic_shape(), H200_MOE, Admission(reading_s=2.0))
    # 2027-03-28: clocks go from 02:00 to 03:00. 00:10 to 06:00 on the wall is 4 h 50 min.
    spring = answer_deadline(plan, datetime(2027, 3, 28, 0, 10, tzinfo=berlin), time(6, 0))
    assert spring.seconds == 4 * 3600 + 50 * 60
    # 2027-10-31: 03:00 back to 02:00. 00:10 to 06:00 is 6 h 50 min.
    autumn = answer_deadline(plan, datetime(2027, 10, 31, 0, 10, tzinfo=berlin), time(6, 0))
    assert autumn.seconds == 6 * 3600 + 50 * 60
    assert spring.deadline.hour == autumn.deadline.hour == 6


def test_a_deadline_before_the_start_time_is_dated_the_next_day() -> None:
    # The night starts at 00:10; "by 00:05" is the next day's, 23 h 55 min later. Shown as
    # "00:10 UTC to 00:05" the window read as ending before it began.
    env = {"NIGHTDESK_SCHEDULE_CRON": "10 0 * * *", "NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
    answer = plan_json("--tickers", "500", "--deadline", "00:05", env=env)["deadline"]
    assert answer["seconds"] == 23 * 3600 + 55 * 60
    start, end = answer["start"][:10], answer["deadline"][:10]
    assert start < end
    table = " ".join(run_cli("plan", "--tickers", "500", "--deadline", "00:05", env=env)
                     .stdout.split())
    assert f"{start} 00:10 UTC to {end} 00:05 (23 h 55 min)" in table
    # The same day's deadline needs no date.
    later = " ".join(run_cli("plan", "--tickers", "500", "--deadline", "06:00", env=env)
                     .stdout.split())
    assert "00:10 UTC to 06:00 (5 h 50 min)" in later


def test_a_shape_whose_largest_call_fits_no_endpoint_is_refused(sqlite_engine: Any) -> None:
    # The synthetic ticker's largest call is 21,500 tokens (a 20,000-token prompt and its
    # 1,500-token answer). A night on a server of 8,192 tokens a sequence, or of a 10,000-token
    # cache, cannot run it; the bound, counting tokens only, planned hours for it.
    short = _night(sqlite_engine, {**FACTS, "kv_cache_tokens": 93_184, "max_model_len": 8_192})
    small = _night(sqlite_engine, FACTS)
    for night, says in ((short, "--max-model-len (8,192 tokens)"),
                        (small, "KV cache (10,000 tokens)")):
        refused = run_cli("plan", "--tickers", "10", "--profile", str(night))
        assert refused.code == 2 and len(refused.error_lines) == 1, refused.stderr
        assert ("synthetic's largest call (21,500 tokens, prompt and output) does not fit "
                f"batch {night}'s {says}") in refused.error_lines[0]
    # The recorded night's own calls fit its server: its largest is c, 300 + 30 tokens.
    plan = plan_json("--tickers", "10", "--shape", str(short), "--profile", str(short))
    assert plan["shape"]["longest_request_tokens"] == 330
    assert plan["profile"]["max_model_len"] == 8_192
    assert plan_json("--tickers", "10")["shape"]["longest_request_tokens"] == 21_500


def test_plan_csv_carries_the_deadline_answer() -> None:
    env = {"NIGHTDESK_SCHEDULE_CRON": "0 0 * * *", "NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
    result = run_cli("plan", "--tickers", "500", "--deadline", "00:15", "--format", "csv",
                     env=env)
    assert result.code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    # 900 s: six H200s (853 s) and more finish, five (961 s) do not.
    assert [r["endpoints"] for r in rows if r["by_deadline"] == "True"] == [
        str(n) for n in range(6, 17)]
    assert {r["by_deadline"] for r in rows[:5]} == {"False"}
    plan = plan_json("--tickers", "500", "--deadline", "00:15", env=env)
    assert [r["by_deadline"] for r in plan["rows"]] == [r["by_deadline"] == "True" for r in rows]
    # Without a deadline the column is there, empty: a script reads one header either way.
    bare = list(csv.DictReader(io.StringIO(run_cli("plan", "--tickers", "500", "--format",
                                                   "csv").stdout)))
    assert {r["by_deadline"] for r in bare} == {""}


def test_a_night_under_a_minute_is_shown_in_seconds(sqlite_engine: Any) -> None:
    # The helper's ticker (60 output tokens, a 50-token chain) on an H200: about a second.
    night = _night(sqlite_engine, FACTS)
    shown = run_cli("plan", "--tickers", "4", "--shape", str(night))
    assert shown.code == 0, shown.stderr
    best = plan_json("--tickers", "4", "--shape", str(night))["best_makespan_s"]
    assert best < 60 and f"({best:.1f} s on 16)" in shown.stdout
    assert "0.0 min" not in shown.stdout


def test_a_paused_nights_bound_is_set_against_the_time_its_calls_ran(sqlite_engine: Any) -> None:
    # Crashed after b, resumed 300 s later: 340 s from first call to last, 40 s of them with
    # calls running (every tok/s figure divides by those). Against the bound's 33.3 s the
    # night is 1.20 x, not the 10.2 x its wall time would make it.
    night = _night(sqlite_engine, FACTS, pause_s=300.0)
    report = json.loads(run_cli("report", str(night), "--format", "json").stdout)
    assert report["wall_seconds"] == 340.0 and report["active_seconds"] == 40.0
    bound = report["graph_bound"]
    assert bound["makespan_s"] == 40.0
    assert bound["makespan_over_bound"] == pytest.approx(1.2)
    line = " ".join(run_cli("report", str(night)).stdout.split())
    assert ("graph bound: makespan 40 s (its calls running; 1 pause, 300 s, left out) = 1.20 x"
            in line)


def test_the_rate_of_each_row_is_named_the_bounds() -> None:
    # The rate is output ÷ bound_s, the bound's; named output_tok_s it read as the planned
    # makespan's, which is slower (the admitted cache and the ramp).
    plan = plan_json("--tickers", "500")
    for row in plan["rows"]:
        assert "output_tok_s" not in row
        assert row["bound_output_tok_s"] == pytest.approx(500 * OUTPUT_PER_TICKER / row["bound_s"])
        assert row["bound_output_tok_s"] > 500 * OUTPUT_PER_TICKER / row["makespan_s"]
    header = run_cli("plan", "--tickers", "500", "--format", "csv").stdout.splitlines()[0]
    assert "bound_output_tok_s" in header.split(",")
    table = " ".join(run_cli("plan", "--tickers", "500").stdout.split())
    # One endpoint: 12,750,000 tokens in the bound's 4,543 s.
    assert "bound's tok/s" in table and f"{plan['rows'][0]['bound_output_tok_s']:.0f}" in table


def test_a_deadline_past_the_next_nights_start_is_flagged() -> None:
    from datetime import UTC, datetime, time, timedelta

    from app.bench.plan import answer_deadline

    # Every minute: the night after the next starts a minute after it; a deadline three
    # hours on lies past it, and a night running to it overlaps the next one.
    env = {"NIGHTDESK_SCHEDULE_CRON": "* * * * *", "NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
    later = f"{datetime.now(UTC) + timedelta(hours=3):%H:%M}"
    answer = plan_json("--tickers", "500", "--deadline", later, env=env)["deadline"]
    assert answer["overlaps_next_night"] is True
    assert answer["next_start"] > answer["start"]
    table = " ".join(run_cli("plan", "--tickers", "500", "--deadline", later, env=env)
                     .stdout.split())
    assert "WARNING" in table and "overlaps the next night" in table
    rows = list(csv.DictReader(io.StringIO(run_cli(
        "plan", "--tickers", "500", "--deadline", later, "--format", "csv", env=env).stdout)))
    assert {r["deadline_overlaps_next_night"] for r in rows} == {"True"}
    # Daily: a deadline of the start's own time is the next start itself, no overlap.
    daily = {"NIGHTDESK_SCHEDULE_CRON": "0 0 * * *", "NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
    same = plan_json("--tickers", "500", "--deadline", "00:00", env=daily)["deadline"]
    assert same["seconds"] == 24 * 3600 and same["overlaps_next_night"] is False
    assert "WARNING" not in run_cli("plan", "--tickers", "500", "--deadline", "00:00",
                                    env=daily).stdout
    # Every six hours: 05:59 from 00:00 is in time; 06:01 is past 06:00's night.
    plan = plan_fleet(500, synthetic_shape(), H200_MOE, Admission(reading_s=2.0))
    start = datetime(2027, 1, 4, 0, 0, tzinfo=UTC)
    following = start + timedelta(hours=6)
    assert not answer_deadline(plan, start, time(5, 59), following).overlaps_next_night
    assert answer_deadline(plan, start, time(6, 1), following).overlaps_next_night


@pytest.mark.parametrize(("facts", "says"), [
    # Text: a ValueError traceback from int(); -5 or a sequence cap of -1: "no answered
    # output to bound" in report and "asks for no output" or "-5 tokens" in plan, none true.
    ({"kv_cache_tokens": "lots", "max_num_seqs": 4}, "kv_cache_tokens as 'lots'"),
    ({"kv_cache_tokens": -5, "max_num_seqs": 4}, "kv_cache_tokens as -5"),
    ({"kv_cache_tokens": 0, "max_num_seqs": 4}, "kv_cache_tokens as 0"),
    ({"kv_cache_tokens": 10_000, "max_num_seqs": -1}, "max_num_seqs as -1"),
    ({"kv_cache_tokens": 10_000, "max_num_seqs": 4, "max_model_len": "8k"},
     "max_model_len as '8k'"),
])
def test_server_facts_of_no_count_are_named_not_modelled(sqlite_engine: Any,
                                                         facts: dict[str, Any],
                                                         says: str) -> None:
    night, whole = _night(sqlite_engine, facts), _night(sqlite_engine, FACTS)
    line = f"batch {night}'s server facts record {says}, not a positive whole number"
    refused = run_cli("plan", "--tickers", "4", "--shape", str(whole), "--profile", str(night))
    assert refused.code == 2 and len(refused.error_lines) == 1, refused.stderr
    assert line in refused.error_lines[0]
    shown = run_cli("report", str(night))
    assert shown.code == 0, shown.stderr
    assert f"graph bound: not computed ({line})" in " ".join(shown.stdout.split())
    # A whole float is a count: a startup log may write one so.
    fine = _night(sqlite_engine, {"kv_cache_tokens": 10_000.0, "max_num_seqs": 4.0})
    assert plan_json("--tickers", "4", "--shape", str(whole), "--profile", str(fine))[
        "profile"]["kv_tokens"] == 10_000


def test_plan_json_and_csv_name_their_schema() -> None:
    # A field was renamed (output_tok_s, before 2026-12-07) with nothing in the output to
    # say which shape a reader holds. The JSON now leads with its schema, every CSV row
    # carries it.
    plan = plan_json("--tickers", "5")
    assert next(iter(plan)) == "schema" and plan["schema"] == "plan/1"
    rows = list(csv.DictReader(io.StringIO(run_cli("plan", "--tickers", "5", "--format",
                                                   "csv").stdout)))
    assert [r["schema"] for r in rows] == ["plan/1"] * 16


def test_a_ticker_runs_on_one_endpoint_so_more_endpoints_than_tickers_shorten_nothing(
        ) -> None:
    # A server whose step grows 20 ms with each running request (a CPU's, roughly). A
    # ticker's whole chain goes to one endpoint, so the night ends with the endpoint that
    # holds the most whole tickers. Before, the plan split tickers over endpoints in
    # fractions: 1 ticker "needed" 10 endpoints (930 s on 1, 477 s on 9), and 17 tickers 15,
    # where 9 endpoints (2 tickers on the busiest) finish as soon as 16 do.
    slow = H200_MOE.model_copy(update={"name": "slow", "step_b_s": 0.02})
    for tickers, smallest in ((1, 1), (2, 2), (5, 5), (17, 9)):
        plan = plan_fleet(tickers, synthetic_shape(), slow, Admission(reading_s=2.0))
        assert plan.smallest_within_5pct == smallest, tickers
        one = plan_fleet(-(-tickers // 16), synthetic_shape(), slow, Admission(reading_s=2.0))
        assert plan.rows[15].makespan_s == pytest.approx(one.rows[0].makespan_s)
        assert all(r.bound_s <= r.makespan_s for r in plan.rows)


def test_a_fleet_past_16_is_named_when_the_table_stops_short_of_the_best() -> None:
    # 5,000 tickers: the best of 1..16 is 16 (49.8 min), so "the smallest fleet within 5% of
    # the best" read 16, where more endpoints shorten the night to 7.1 min. Now the least any
    # fleet gets (a ticker an endpoint) and the fewest endpoints within 5% of it are given.
    plan = plan_json("--tickers", "5000")
    assert plan["smallest_within_5pct"] == 16
    one = plan_fleet(1, synthetic_shape(), H200_MOE, Admission(reading_s=2.0)).rows[0]
    assert plan["floor_s"] == pytest.approx(one.makespan_s)
    assert plan["smallest_within_5pct_of_floor"] == 1_000
    table = " ".join(run_cli("plan", "--tickers", "5000").stdout.split())
    assert "past 16: more endpoints still shorten the night, to 7.1 min at least" in table
    assert "within 5% of that: 1,000 endpoints" in table
    assert "past 16" not in " ".join(run_cli("plan", "--tickers", "7").stdout.split())
    # The fewest: one fewer endpoint puts more whole tickers on the busiest, over 5%.
    for tickers in (7, 100, 500, 5_000):
        plan = plan_json("--tickers", str(tickers))
        fewest, floor = plan["smallest_within_5pct_of_floor"], plan["floor_s"]

        def busiest(endpoints: int, tickers: int = tickers) -> float:
            held = -(-tickers // endpoints)
            return plan_fleet(held, synthetic_shape(), H200_MOE,
                              Admission(reading_s=2.0)).rows[0].makespan_s
        assert busiest(fewest) <= 1.05 * floor < busiest(fewest - 1), tickers


@pytest.mark.parametrize(("ran", "warned"), [
    ("smollm2-135m", True),  # another model than h200-moe serves: said
    ("qwen-moe-35b-a3b", False),  # the profile's own served name
    (None, False)])  # not recorded: nothing to compare
def test_a_shape_of_another_model_than_the_endpoint_is_said(
        sqlite_engine: Any, ran: str | None, warned: bool) -> None:
    # Before, --shape of a tiny model's night planned its token counts on the MoE's H200
    # without a word: another tokenizer's counts, another model's output lengths.
    from sqlalchemy import update

    from app.db.models import Batch

    night = _night(sqlite_engine, FACTS)
    with sqlite_engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == night).values(
            settings={} if ran is None else {"model": ran}))
    shown = run_cli("plan", "--tickers", "4", "--shape", str(night))
    as_json = run_cli("plan", "--tickers", "4", "--shape", str(night), "--format", "json")
    assert (shown.code, as_json.code) == (0, 0), shown.stderr
    said = [line for line in shown.stderr.splitlines() if line.startswith("warning: two models")]
    mismatch = json.loads(as_json.stdout)["model_mismatch"]
    if warned:
        assert said == [f"warning: two models: batch {night} ran 'smollm2-135m', h200-moe "
                        "serves 'qwen-moe-35b-a3b': its token counts are another tokenizer's "
                        "and its output lengths another model's"]
        assert mismatch == said[0].removeprefix("warning: two models: ")
        assert "warning: two models" in as_json.stderr
    else:
        assert not said and mismatch is None
    # The night on its own server model: one model, nothing to say.
    own = run_cli("plan", "--tickers", "4", "--shape", str(night), "--profile", str(night))
    assert own.code == 0 and "two models" not in own.stderr, own.stderr


def test_a_night_behind_a_router_of_several_servers_is_no_one_servers_profile(
        sqlite_engine: Any) -> None:
    # Its readings are the servers' summed (one router endpoint): a step fitted to them,
    # with the fleet's KV, modelled a server none of them is (docs/lab/
    # 2026-12-07-fleet-outside.md).
    fleet = _night(sqlite_engine, {**FACTS, "kv_cache_tokens": 20_000,
                                   "servers_behind_router": 2})
    refused = run_cli("plan", "--tickers", "4", "--profile", str(fleet))
    assert refused.code == 2 and len(refused.error_lines) == 1, refused.stderr
    assert (f"batch {fleet} ran behind a router of 2 servers, whose readings are summed"
            in refused.error_lines[0])
    assert "--profile h200-moe" in refused.error_lines[0]
    # One server behind a router: its readings are that server's.
    alone, whole = _night(sqlite_engine, {**FACTS, "servers_behind_router": 1}), \
        _night(sqlite_engine, FACTS)
    assert plan_json("--tickers", "4", "--shape", str(whole), "--profile", str(alone))[
        "profile"]["kv_tokens"] == FACTS["kv_cache_tokens"]
