"""`/metrics`: scraped as Prometheus would, parsed with prometheus_client's own text parser.

Night 1 (D1) succeeded, created at DUE1 and finished 40 minutes later. Night 2 (D2), due at
DUE2, created then: a partial night of 3 tickers (2 succeeded, 1 failed), 90 minutes long,
with 10 calls of 5 output tokens, one a second for 1 s (50 tokens over 10 s: 5.0 tok/s).
The scheduler daemon's heartbeat row says DUE2 + 2 h. Scraped at DUE2 + 3 h.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import time_machine
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, insert

from agents.nodes import ANALYSTS
from app.cli.web import open_metrics_port
from app.config import Settings, load_settings
from app.db.models import SchedulerBeat
from app.morning.eta import RATIO_FIRST
from tests.unit.support.clirun import run_cli
from tests.unit.support.eta_rows import NODES, calls, counter
from tests.unit.support.night_rows import Rated, add_night, add_resumed_calls, at
from tests.unit.support.webclient import PASSWORD, USER, web_client
from tests.webhook import closed_port

D1, D2 = date(2026, 11, 26), date(2026, 11, 27)
DUE1, DUE2 = at(date(2026, 11, 27), 0, 10), at(date(2026, 11, 28), 0, 10)


def settings() -> Settings:
    return load_settings(schedule_timezone="UTC", schedule_cron="10 0 * * *")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Return every sample of a scrape as {(name, labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def client(sqlite_engine: Engine) -> Iterator[TestClient]:
    with web_client(sqlite_engine, settings=settings()) as c:
        yield c


def stored_nights(engine: Engine) -> tuple[int, int]:
    first = add_night(engine, D1, DUE1, {"AAA": Rated("Buy", 0.8), "BBB": Rated("Hold", 0.0)})
    second = add_night(engine, D2, DUE2, {"AAA": Rated("Buy", 0.7), "BBB": Rated("Hold", 0.1),
                                          "CCC": Rated(error="LLMTimeoutError")},
                       minutes=90, calls=10)
    with engine.begin() as conn:
        conn.execute(insert(SchedulerBeat).values(
            host="gpu-1", pid=42, started_at=DUE1, beat_at=DUE2 + timedelta(hours=2),
            next_run_at=DUE2 + timedelta(days=1), schedule="10 0 * * * (UTC)"))
    return first, second


def test_metrics_read_the_stored_nights(sqlite_engine: Engine, client: TestClient) -> None:
    stored_nights(sqlite_engine)
    with time_machine.travel(DUE2 + timedelta(hours=3), tick=False):
        response = client.get("/metrics", auth=(USER, PASSWORD))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    got = samples(response.text)
    # The newest *succeeded* night is night 1 (night 2 was partial): its end.
    assert got[("nightdesk_night_last_success_timestamp_seconds", ())] == \
        (DUE1 + timedelta(minutes=40)).timestamp()
    status = {dict(labels)["status"]: value for (name, labels), value in got.items()
              if name == "nightdesk_night_last_status"}
    assert status == {"succeeded": 0, "partial": 1, "failed": 0, "interrupted": 0,
                      "crashed": 0, "running": 0, "stale": 0, "none": 0}
    tickers = {dict(labels)["status"]: value for (name, labels), value in got.items()
               if name == "nightdesk_night_tickers"}
    assert tickers == {"succeeded": 2, "failed": 1, "missing": 0, "rerun": 0}
    assert got[("nightdesk_night_duration_seconds", ())] == 90 * 60
    assert got[("nightdesk_night_output_tokens_per_second", ())] == 5.0
    assert got[("nightdesk_scheduler_heartbeat_timestamp_seconds", ())] == \
        (DUE2 + timedelta(hours=2)).timestamp()
    assert got[("nightdesk_night_ranking_fresh", ())] == 1
    assert got[("nightdesk_night_next_due_timestamp_seconds", ())] == \
        (DUE2 + timedelta(days=1)).timestamp()
    assert got[("nightdesk_metrics_database_up", ())] == 1


def test_a_failed_ticker_a_rerun_rated_is_counted_as_the_ranking_shows_it(
        sqlite_engine: Engine, client: TestClient) -> None:
    # CCC failed in night 2; a rerun of its date rated it, which the ranking applies (no
    # ticker unrated, no banner, no advice). The scrape counted it failed all the same.
    _, second = stored_nights(sqlite_engine)
    rerun = add_night(sqlite_engine, D2, DUE2 + timedelta(hours=2), {"CCC": Rated("Hold", 0.0)},
                      kind="rerun")
    with time_machine.travel(DUE2 + timedelta(hours=3), tick=False):
        got = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
        ranked = client.get("/api/ranking", auth=(USER, PASSWORD)).json()
        page = client.get(f"/batches/{second}", auth=(USER, PASSWORD)).text
        said = run_cli("report", str(second))
        given = run_cli("report", str(second), "--format", "json")
    # `report` and the batch page keep the batch's own failure, and say the rerun rated it
    # since, as the ranking applies it (they listed it failed, nothing more).
    assert f"CCC (failed, rated since by rerun #{rerun}): LLMTimeoutError" in said.stdout, \
        said.stdout
    assert [(f["ticker"], f["rated_by"]) for f in json.loads(given.stdout)["failed_tickers"]] \
        == [("CCC", rerun)]
    assert f'rated since by <a href="/batches/{rerun}">rerun #{rerun}</a>' in page
    tickers = {dict(labels)["status"]: value for (name, labels), value in got.items()
               if name == "nightdesk_night_tickers"}
    assert tickers == {"succeeded": 2, "failed": 0, "missing": 0, "rerun": 1}
    assert [r["ticker"] for r in ranked["rows"] if r["rank"] is None] == []
    assert got[("nightdesk_night_last_status", (("status", "partial"),))] == 1  # the batch's


def test_a_fire_that_found_a_stopped_nights_date_analyzed_is_no_refusal_of_it(
        sqlite_engine: Engine, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # `run --continue-night` of the partial night 2 (CCC failed on its own account: no
    # resume owed) runs nothing and keeps a row saying so; the scrape exported it as
    # nightdesk_night_refused_timestamp_seconds ("the resume of a night that stopped short
    # refused"), and `batches` said "not listed: night of … REFUSED" of a listed night.
    from app.runs.nightly import NightlyRequest, run_nightly

    _, second = stored_nights(sqlite_engine)
    monkeypatch.setenv("NIGHTDESK_NOTIFY", "")
    with time_machine.travel(DUE2 + timedelta(hours=2), tick=False):
        result = run_nightly(settings(), NightlyRequest(as_of=D2), engine=sqlite_engine,
                             resume=True, once_per_as_of=True)
    assert result.covered_by == second
    with time_machine.travel(DUE2 + timedelta(hours=3), tick=False):
        got = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
        listed = run_cli("batches", env={"NIGHTDESK_SCHEDULE_TIMEZONE": "UTC",
                                         "NIGHTDESK_SCHEDULE_CRON": "10 0 * * *"})
    assert got[("nightdesk_night_last_status", (("status", "partial"),))] == 1
    assert ("nightdesk_night_refused_timestamp_seconds", ()) not in got
    assert "not listed" not in listed.stderr, listed.stderr


def test_a_stale_mornings_notice_that_its_date_was_analyzed_is_no_refusal(
        sqlite_engine: Engine, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # The next due time's fire finds D2 analyzed (no newer snapshot): the morning is stale,
    # its reason names the notice, and the scrape exported it as a refused night (an alert
    # on refusals would fire each morning without new data, a weekend's, say).
    from app.runs.nightly import NightlyRequest, run_nightly

    _, second = stored_nights(sqlite_engine)
    monkeypatch.setenv("NIGHTDESK_NOTIFY", "")
    due3 = DUE2 + timedelta(days=1)
    with time_machine.travel(due3, tick=False):
        result = run_nightly(settings(), NightlyRequest(as_of=D2), engine=sqlite_engine,
                             resume=True, once_per_as_of=True)
    assert result.covered_by == second
    with time_machine.travel(due3 + timedelta(hours=1), tick=False):
        got = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
        night = client.get("/api/ranking", auth=(USER, PASSWORD)).json()["night"]
    assert got[("nightdesk_night_last_status", (("status", "stale"),))] == 1
    assert f"already analyzed by nightly batch #{second}" in night["reason"]
    assert ("nightdesk_night_refused_timestamp_seconds", ()) not in got


def test_a_resumed_nights_rate_leaves_its_pause_out(sqlite_engine: Engine,
                                                   client: TestClient) -> None:
    night = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Buy", 0.5)}, minutes=130)
    add_resumed_calls(sqlite_engine, night, DUE2)
    with time_machine.travel(DUE2 + timedelta(hours=3), tick=False):
        got = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    # 16,000 tokens over the 200 s its calls ran; the 2 h stop apart.
    assert got[("nightdesk_night_output_tokens_per_second", ())] == 80.0
    assert got[("nightdesk_night_paused_seconds", ())] == 7_200.0


def test_a_running_nights_eta_and_its_interval(sqlite_engine: Engine,
                                               client: TestClient) -> None:
    now = DUE2 + timedelta(minutes=30)
    running = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Buy", 0.7),
                                                  "BBB": Rated(status="running"),
                                                  "CCC": Rated("Buy", 0.7),
                                                  "DDD": Rated("Buy", 0.7)},
                        status="running", heartbeat=now - timedelta(seconds=5))
    calls(sqlite_engine, running, "AAA", NODES, end=now - timedelta(minutes=5))
    for ticker in ("CCC", "DDD"):  # two at a time
        calls(sqlite_engine, running, ticker, NODES, end=now - timedelta(minutes=10))
    calls(sqlite_engine, running, "BBB", list(ANALYSTS), end=now)
    # The servers' output (600 tokens) made in the last minute, while BBB's analysts ran:
    # a first night's work is at least the output left at that rate.
    counter(sqlite_engine, running, [0.0, 0.0, 10.0, 10.0], now=now)
    with time_machine.travel(now, tick=False):
        got = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    eta = {dict(labels)["bound"]: value for (name, labels), value in got.items()
           if name == "nightdesk_night_eta_seconds"}
    # BBB's 13 later calls at each node's share of the server (4 s alone, 2 s two at a
    # time): 8/3 s on the mean; the interval that estimate at the calibrated ratios.
    said = 13 * 8 / 3
    assert eta == {"estimate": 35.0, "low": round(said * RATIO_FIRST[0]),
                   "high": round(said * RATIO_FIRST[1])}


def test_a_missed_night_and_a_night_cut_short(sqlite_engine: Engine,
                                              client: TestClient) -> None:
    stored_nights(sqlite_engine)
    # The next night was created at its due time and interrupted after 2 of 4 tickers.
    due3 = DUE2 + timedelta(days=1)
    add_night(sqlite_engine, date(2026, 11, 28), due3, {
        "AAA": Rated("Buy", 0.7), "BBB": Rated("Hold", 0.1),
        "CCC": Rated(status="interrupted"), "DDD": Rated(status="interrupted")},
        status="interrupted", minutes=20)
    with time_machine.travel(due3 + timedelta(hours=1), tick=False):
        cut = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    assert cut[("nightdesk_night_last_status", (("status", "interrupted"),))] == 1
    assert cut[("nightdesk_night_tickers", (("status", "missing"),))] == 2
    assert cut[("nightdesk_night_tickers", (("status", "succeeded"),))] == 2
    assert cut[("nightdesk_night_ranking_fresh", ())] == 0
    assert cut[("nightdesk_night_last_success_timestamp_seconds", ())] == \
        (DUE1 + timedelta(minutes=40)).timestamp()
    # A day later no night came at all: stale.
    with time_machine.travel(due3 + timedelta(days=1, hours=1), tick=False):
        stale = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    assert stale[("nightdesk_night_last_status", (("status", "stale"),))] == 1
    assert stale[("nightdesk_night_last_status", (("status", "interrupted"),))] == 0
    # The interrupted night's figures are not tonight's: no gauge says them as current.
    assert not {name for name, _ in stale} & {"nightdesk_night_tickers",
                                               "nightdesk_night_duration_seconds",
                                               "nightdesk_night_output_tokens_per_second"}


def test_an_older_date_analyzed_again_is_no_success_of_this_mornings(
        sqlite_engine: Engine, client: TestClient) -> None:
    # `run --as-of D1` in the morning after D2's night never came: its success reset the
    # "no successful night in 26 h" rule's clock, while the status reads stale.
    first = add_night(sqlite_engine, D1, DUE1, {"AAA": Rated("Buy", 0.8)})
    add_night(sqlite_engine, D1 - timedelta(days=1), DUE2 + timedelta(hours=2),
              {"AAA": Rated("Buy", 0.8)})
    with time_machine.travel(DUE2 + timedelta(hours=8), tick=False):
        got = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    assert got[("nightdesk_night_last_status", (("status", "stale"),))] == 1
    assert got[("nightdesk_night_last_success_timestamp_seconds", ())] == \
        (DUE1 + timedelta(minutes=40)).timestamp(), first


def test_a_daemon_that_stopped_drops_its_heartbeat_and_one_that_died_keeps_it(
        sqlite_engine: Engine, client: TestClient) -> None:
    from app.runs.daemon import Heartbeat

    with Heartbeat(sqlite_engine, 30.0, lambda: None, "10 0 * * * (UTC)") as beat:
        beat.beat()
        alive = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
        dead = Heartbeat(sqlite_engine, 30.0, lambda: None, "10 0 * * * (UTC)")
    assert ("nightdesk_scheduler_heartbeat_timestamp_seconds", ()) in alive
    stopped = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    assert ("nightdesk_scheduler_heartbeat_timestamp_seconds", ()) not in stopped
    # A daemon killed (no stop ran) leaves its last beat, for the "silent" alert to see.
    with time_machine.travel(DUE2, tick=False):
        dead.beat()
    with time_machine.travel(DUE2 + timedelta(hours=1), tick=False):
        killed = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    assert killed[("nightdesk_scheduler_heartbeat_timestamp_seconds", ())] == \
        DUE2.timestamp()


def test_an_empty_database_says_no_success_yet(client: TestClient,
                                               sqlite_engine: Engine) -> None:
    got = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    assert got[("nightdesk_night_last_success_timestamp_seconds", ())] == 0
    # "none": no night ever ran here, not "stale" (a night due that did not come).
    assert got[("nightdesk_night_last_status", (("status", "none"),))] == 1
    assert ("nightdesk_scheduler_heartbeat_timestamp_seconds", ()) not in got  # no daemon
    assert ("nightdesk_night_duration_seconds", ()) not in got


def test_metrics_are_behind_the_pages_auth(client: TestClient) -> None:
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", auth=(USER, "wrong")).status_code == 401


def test_a_database_that_cannot_be_read_still_answers_a_scrape(client: TestClient,
                                                               sqlite_engine: Engine,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("database away")

    monkeypatch.setattr("app.morning.prometheus.night_status", broken)
    got = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    assert got == {("nightdesk_metrics_database_up", ()): 0}


def test_the_separate_port_serves_metrics_without_auth_on_loopback_only(
        sqlite_engine: Engine) -> None:
    stored_nights(sqlite_engine)
    port = closed_port()
    with open_metrics_port(port, sqlite_engine, settings()), \
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        got = samples(reply.read().decode())
    assert got[("nightdesk_metrics_database_up", ())] == 1
    assert got[("nightdesk_night_last_success_timestamp_seconds", ())] == \
        (DUE1 + timedelta(minutes=40)).timestamp()
    with pytest.raises(httpx.ConnectError):  # closed with the context
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_the_metrics_port_must_differ_from_the_pages_port() -> None:
    result = run_cli("web", "--local-only", "--port", "8080", "--metrics-port", "8080")
    assert result.code == 2
    [line] = result.error_lines
    assert "--metrics-port 8080 is the pages' own --port" in line


def test_a_metrics_port_in_use_is_one_line(sqlite_engine: Engine) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("web", "--local-only", "--port", str(closed_port()),
                         "--metrics-port", str(port))
    assert result.code == 2
    [line] = result.error_lines
    assert line.startswith(f"error: --metrics-port {port}: cannot listen on 127.0.0.1:{port}")


def test_a_running_night_reports_its_duration_so_far(sqlite_engine: Engine,
                                                     client: TestClient) -> None:
    now = datetime(2026, 11, 28, 1, 0, tzinfo=UTC)
    add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Buy", 0.7),
                                        "BBB": Rated(status="running")},
              status="running", heartbeat=now - timedelta(seconds=30))
    with time_machine.travel(now, tick=False):
        got = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    assert got[("nightdesk_night_last_status", (("status", "running"),))] == 1
    # To now, as the pages and `nightdesk batches` give it, not to its heartbeat 30 s ago.
    assert got[("nightdesk_night_duration_seconds", ())] == (now - DUE2).total_seconds()


def test_each_metrics_help_says_what_the_operations_table_says(
        sqlite_engine: Engine, client: TestClient) -> None:
    # A dead night's duration ends at the later of its last heartbeat and its last call's end
    # (``summary.last_alive``); the scrape's HELP, what a Prometheus user reads, said "to its
    # last heartbeat", as before a night killed before its first beat was counted.
    stored_nights(sqlite_engine)
    with time_machine.travel(DUE2 + timedelta(hours=3), tick=False):
        scrape = client.get("/metrics", auth=(USER, PASSWORD)).text
    helps = {family.name: family.documentation
             for family in text_string_to_metric_families(scrape)}
    table = (Path(__file__).parents[3] / "docs" / "operations.md").read_text()
    rows = dict(re.findall(r"^\| `(nightdesk_\w+)[^`]*` \| (.*) \|$", table, re.MULTILINE))
    assert set(helps) <= set(rows), set(helps) - set(rows)
    # Where both give the figure's span in parentheses, they give the same span.
    said = re.search(r"\(to now while it runs, [^)]*\)", rows["nightdesk_night_duration_seconds"])
    assert said is not None and said.group(0) in helps["nightdesk_night_duration_seconds"]


def test_a_sub_second_night_gives_its_tokens_and_time_and_no_rate(
        sqlite_engine: Engine, client: TestClient) -> None:
    # A night (a rerun of one ticker on a fast server) whose calls ran 0.3 s in all: the
    # digest read "Duration: 0 s; output 976.7 tok/s (293 tokens over 0 s of calls)", a
    # rate that divides by almost nothing beside a time that reads as none; /metrics, the
    # report and the batch page gave the same rate.
    from sqlalchemy.orm import Session

    from app.db.models import LLMCall
    from app.morning.digest import build_digest

    night = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Buy", 0.7)}, minutes=0.3 / 60)
    with Session(sqlite_engine) as s:
        for i, (node, tokens) in enumerate(zip(ANALYSTS, (100, 100, 93), strict=False)):
            start = DUE2 + timedelta(seconds=0.1 * i)
            s.add(LLMCall(batch_id=night, ticker="AAA", node=node, sample=0, model="tiny",
                          prompt_tokens=10, completion_tokens=tokens, status="ok",
                          started_at=start, ended_at=start + timedelta(seconds=0.1),
                          latency_s=0.1))
        s.commit()
    body = build_digest(sqlite_engine, settings(), night).message.body.splitlines()
    assert body[1] == ("Duration: <1 s; output 293 tokens over <1 s of calls, too brief for a "
                       "rate; 3 calls (3 attempts, 0 failed)")
    with time_machine.travel(DUE2 + timedelta(minutes=5), tick=False):
        got = samples(client.get("/metrics", auth=(USER, PASSWORD)).text)
    assert got[("nightdesk_night_duration_seconds", ())] == pytest.approx(0.3)
    assert ("nightdesk_night_output_tokens_per_second", ()) not in got
    shown = run_cli("report", str(night), env={"COLUMNS": "200"}).stdout
    assert re.search(r"batch output tok/s[\s│]+— \(under 1 s of calls: too brief for a rate\)",
                     shown), shown
    assert "of tickers that succeeded" not in shown
    page = client.get(f"/batches/{night}", auth=(USER, PASSWORD)).text
    assert '<span class="big" id="throughput-value">—</span>' in page
    assert "293 tokens over &lt;1 s of calls: too brief for a rate" in page
