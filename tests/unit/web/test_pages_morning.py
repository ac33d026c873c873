"""The morning pages over built nights: the night's status, the changes, one truth with the CLI.

Nights come from ``night_rows``; the clock is frozen; the schedule is 00:10 UTC. Expected
values are written out from the rows each test adds.
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime, timedelta

import pytest
import time_machine
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from agents.nodes import ANALYSTS
from app.db.models import BatchWarning, Decision, SchedulerBeat
from app.morning import eta
from tests.unit.support.clirun import run_cli
from tests.unit.support.eta_rows import NODES, calls, counter
from tests.unit.support.night_rows import Rated, add_night, add_resumed_calls, at, table
from tests.unit.support.webclient import AUTH

D1, D2 = date(2026, 11, 26), date(2026, 11, 27)
DUE1, DUE2 = at(date(2026, 11, 27), 0, 10), at(date(2026, 11, 28), 0, 10)
MORNING = DUE2 + timedelta(hours=8)
UTC_ENV = {"NIGHTDESK_SCHEDULE_TIMEZONE": "UTC", "COLUMNS": "250"}
GOOD = {"AAA": Rated("Buy", 0.8), "BBB": Rated("Hold", 0.0)}


def page(client: TestClient, path: str, now: datetime = MORNING) -> BeautifulSoup:
    with time_machine.travel(now, tick=False):
        response = client.get(path, auth=AUTH)
    assert response.status_code == 200, response.text
    return BeautifulSoup(response.text, "html.parser")


def text(node: object) -> str:
    assert node is not None
    return " ".join(node.get_text().split())  # type: ignore[attr-defined]


def test_a_failed_night_puts_a_banner_over_the_older_ranking(sqlite_engine: Engine,
                                                              client: TestClient) -> None:
    first = add_night(sqlite_engine, D1, DUE1, GOOD)
    second = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error="boom")},
                       status="failed", error="every ticker failed")
    soup = page(client, "/")
    banner = text(soup.find(id="banner"))
    assert banner.startswith("Not the latest night.")
    assert f"batch #{second} (as of {D2}), failed: every ticker failed" in banner
    assert f"this ranking is of {D1} (batch #{first})" in banner
    night = soup.find(id="night")
    assert night is not None and night["data-status"] == "failed"
    assert "Next night due 2026-11-29 00:10:00 UTC" in text(soup.find(id="schedule"))
    assert text(soup.find(id="daemon")) == "none runs"


def test_a_missed_night_is_named_stale(sqlite_engine: Engine, client: TestClient) -> None:
    add_night(sqlite_engine, D1, DUE1, GOOD)
    soup = page(client, "/")
    assert "stale: no nightly batch since the night due 2026-11-28 00:10 UTC" in \
        text(soup.find(id="banner"))
    assert soup.find(id="night")["data-status"] == "stale"  # type: ignore[index]
    # The same morning an hour after the due time of the first night: fresh, no banner.
    assert page(client, "/", DUE1 + timedelta(hours=1)).find(id="banner") is None


def test_the_daemon_heartbeat_shows_current_or_stale(sqlite_engine: Engine,
                                                     client: TestClient) -> None:
    add_night(sqlite_engine, D2, DUE2, GOOD)
    with Session(sqlite_engine) as s:
        s.add(SchedulerBeat(host="gpu-host", pid=42, started_at=DUE1, beat_at=MORNING,
                            next_run_at=DUE2 + timedelta(days=1), schedule="10 0 * * * (UTC)"))
        s.commit()
    assert text(page(client, "/", MORNING + timedelta(seconds=30)).find(id="daemon")) == \
        "heartbeat current"
    assert text(page(client, "/", MORNING + timedelta(minutes=5)).find(id="daemon")) == \
        "heartbeat stale"


def test_change_column_and_changes_section(sqlite_engine: Engine, client: TestClient) -> None:
    add_night(sqlite_engine, D1, DUE1, {
        "AAA": Rated("Hold", 0.0, texts={"news": table(a="bearish", b="bearish")}),
        "BBB": Rated("Buy", 0.7), "EEE": Rated("Sell", -0.7)})
    add_night(sqlite_engine, D2, DUE2, {
        "AAA": Rated("Buy", 0.6, texts={"news": table(a="bullish", b="bullish")}),
        "BBB": Rated("Sell", -0.8), "DDD": Rated("Hold", 0.1),
        "EEE": Rated(error="DataError: no prices")})
    soup = page(client, "/")
    rows = {tr["data-ticker"]: [text(td) for td in tr.find_all("td")]
            for tr in soup.select("#ranking tbody tr")}
    # columns: # ticker rating score spread conf was change summary
    assert rows["AAA"][6] == "Hold +0.00, rank 2" and rows["AAA"][7] == "▲ upgrade"
    assert rows["BBB"][6] == "Buy +0.70, rank 1" and rows["BBB"][7] == "▼ downgrade"
    assert rows["DDD"][6] == "—" and rows["DDD"][7] == "new"
    changes = [[text(td) for td in tr.find_all("td")] for tr in soup.select("#changes tbody tr")]
    assert [c[0] for c in changes] == ["BBB", "AAA", "DDD", "EEE"]
    assert changes[0][4] == "-1.50" and changes[1][4] == "+0.60"
    assert changes[1][5] == "moved most: news bearish→bullish (+2.00)"
    assert changes[3][1] == "dropped" and "DataError: no prices" in changes[3][5]
    assert f"Changes since {D1}" in text(soup.find(id="changes-heading"))


def test_flags_and_warnings_as_the_cli_prints_them(sqlite_engine: Engine,
                                                   client: TestClient) -> None:
    # Underweight at +0.30 contradicts its own score (Underweight is −0.50 to −0.15).
    batch = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Underweight", 0.3),
                                                "BBB": Rated("Hold", 0.0)})
    with Session(sqlite_engine) as s:
        s.add(BatchWarning(batch_id=batch, kind="grade_share", message="Hold is 80% of 10",
                           created_at=MORNING))
        s.commit()
    soup = page(client, "/")
    flagged = {tr["data-ticker"]: tr.select_one(".flag") is not None
               for tr in soup.select("#ranking tbody tr")}
    assert flagged == {"AAA": True, "BBB": False}
    assert [text(w) for w in soup.select(".warning")] == ["Warning: Hold is 80% of 10"]
    with time_machine.travel(MORNING, tick=False):
        cli = run_cli("ranking", env=UTC_ENV)
    # One grading rule: the band of +0.30 is Overweight; the model's Underweight is flagged.
    assert re.search(r"AAA\s+│\s+Overweight !", cli.stdout)
    assert f"warning: batch {batch}: Hold is 80% of 10" in cli.stderr


def test_the_page_and_the_cli_give_the_same_eta(sqlite_engine: Engine,
                                                client: TestClient) -> None:
    add_night(sqlite_engine, D1, DUE1, GOOD)
    now = DUE2 + timedelta(minutes=20)
    running = add_night(sqlite_engine, D2, DUE2,
                        {"AAA": Rated("Buy", 0.7), "BBB": Rated(status="running"),
                         "CCC": Rated(status="queued"), "DDD": Rated(status="queued")},
                        status="running", heartbeat=now - timedelta(seconds=5), calls=17)
    soup = page(client, "/", now)
    assert soup.find("meta", attrs={"http-equiv": "refresh"}) is not None
    # AAA's 17 calls ran 1 s each beside BBB's four analysts (ready since BBB started):
    # a fifth of the server each, so the 51 calls left are about 10 s of work; the longest
    # chain, CCC's or DDD's 14 steps of 1 s, is longer.
    progress = text(soup.select_one(f".progress[data-batch='{running}']"))
    said = text(soup.select_one(f".progress[data-batch='{running}'] .eta"))
    assert "17 of about 68 calls" in progress and said.startswith("about 14 s (")
    with time_machine.travel(now, tick=False):
        cli = run_cli("ranking", env=UTC_ENV)
    assert said in cli.stderr.splitlines()[1]


def test_a_running_batch_page_lists_running_tickers_apart_and_refreshes(
        sqlite_engine: Engine, client: TestClient) -> None:
    now = DUE2 + timedelta(minutes=30)
    running = add_night(sqlite_engine, D2, DUE2,
                        {"AAA": Rated("Buy", 0.7), "BBB": Rated(status="running"),
                         "CCC": Rated(status="queued"), "EEE": Rated(error="DataError: x")},
                        status="running", heartbeat=now - timedelta(seconds=5), calls=34)
    soup = page(client, f"/batches/{running}", now)
    assert soup.find("meta", attrs={"http-equiv": "refresh"}) is not None
    running_rows = [[text(td) for td in tr.find_all("td")][:2]
                    for tr in soup.select("#running tbody tr")]
    assert running_rows == [["BBB", "running"], ["CCC", "queued"]]
    failed_rows = [text(tr.find("td")) for tr in soup.select("#failed tbody tr")]
    assert failed_rows == ["EEE"]
    # AAA's and BBB's 34 calls ran alone, 1 s each: CCC's 17 take 17 s, and BBB, every
    # node answered but still running, is asking its last again: half of a call's 1 s
    # (EEE failed: it runs no more calls). 17.5 s at a first night's calibrated ratios
    # (0.67, 1.80): 11.7 s and 31.5 s.
    assert "34 of about 68 calls" in text(soup.find(id="progress"))
    assert "about 18 s (75% interval: 12 s – 32 s) left" in text(soup.find(id="progress"))
    # Once it is over, nothing reloads.
    done = add_night(sqlite_engine, D1, DUE1, GOOD)
    assert page(client, f"/batches/{done}", now).find("meta",
                                                      attrs={"http-equiv": "refresh"}) is None


def test_the_ticker_page_after_a_failed_night(sqlite_engine: Engine,
                                              client: TestClient) -> None:
    first = add_night(sqlite_engine, D1, DUE1, GOOD)
    second = add_night(sqlite_engine, D2, DUE2,
                       {"AAA": Rated(error="LLMTimeoutError: no answer within 300 s"),
                        "BBB": Rated("Hold", 0.05)})
    soup = page(client, "/ticker/AAA")
    tonight = soup.find(id="tonight")
    assert tonight is not None and tonight["data-state"] == "failed"
    assert text(tonight) == (f"Tonight: failed in nightly batch #{second} (as of {D2}, batch "
                             "partial): LLMTimeoutError: no answer within 300 s")
    assert text(soup.find(id="last-good")) == \
        f"Last good rating: Buy score +0.80, rank 1, as of {D1} (batch #{first})."
    # BBB succeeded tonight: its headline is tonight's rating, no "last good" line.
    bbb = page(client, "/ticker/BBB")
    assert bbb.find(id="tonight")["data-state"] == "rated"  # type: ignore[index]
    assert text(bbb.find(id="tonight")).startswith("Hold score +0.05")
    assert bbb.find(id="last-good") is None


def test_the_ticker_page_headlines_a_later_failed_rerun_with_the_night_below(
        sqlite_engine: Engine, client: TestClient) -> None:
    first = add_night(sqlite_engine, D1, DUE1, GOOD)
    night = add_night(sqlite_engine, D2, DUE2,
                      {"AAA": Rated(error="LLMTimeoutError: no answer within 300 s"),
                       "BBB": Rated("Hold", 0.05)})
    rerun = add_night(sqlite_engine, D2, DUE2 + timedelta(hours=6),
                      {"AAA": Rated(error="HTTP 500: boom")}, kind="rerun")
    soup = page(client, "/ticker/AAA")
    tonight = soup.find(id="tonight")
    # The latest outcome first (the rerun's), the night's own below it.
    assert tonight is not None and tonight["data-state"] == "failed"
    assert text(tonight).startswith(
        f"Its latest rerun of that night: failed in rerun batch #{rerun} (as of {D2}, batch "
        "failed): HTTP 500: boom")
    assert text(soup.find(id="night-outcome")) == (
        f"Tonight: failed in nightly batch #{night} (as of {D2}, batch partial): "
        "LLMTimeoutError: no answer within 300 s")
    assert text(soup.find(id="last-good")) == \
        f"Last good rating: Buy score +0.80, rank 1, as of {D1} (batch #{first})."


def test_the_ticker_page_headlines_the_ranking_s_rating(sqlite_engine: Engine,
                                                        client: TestClient) -> None:
    # Two samples, Underweight −0.48 and Sell −0.70: the ranking's rating is the band of the
    # mean −0.59, Sell; the ticker page must headline the same, not a sample's Underweight.
    batch = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Underweight", -0.48)},
                      settings={"samples": 2, "demo_data": True})
    with Session(sqlite_engine) as s:
        s.add(Decision(batch_id=batch, ticker="AAA", sample=1, rating="Sell", score=-0.70,
                       confidence=0.5, summary="AAA sell", created_at=DUE2))
        s.commit()
    ranking = page(client, "/")
    row = [text(td) for td in ranking.select("#ranking tbody tr")[0].find_all("td")]
    assert row[2:4] == ["Sell", "-0.59"]
    headline = text(page(client, "/ticker/AAA").find(id="tonight"))
    assert headline.startswith("Sell score -0.59 mean of 2 samples")


@pytest.mark.slow
def test_the_ticker_headline_follows_the_ranking_through_reruns(sqlite_engine: Engine,
                                                                client: TestClient) -> None:
    add_night(sqlite_engine, D1, DUE1, GOOD)
    add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error="LLMTimeoutError"),
                                        "BBB": Rated("Hold", 0.05)})
    # AAA's rerun of that night succeeded: the ranking applies it, and so does the headline.
    rerun = add_night(sqlite_engine, D2, DUE2 + timedelta(hours=6),
                      {"AAA": Rated("Overweight", 0.4)}, kind="rerun")
    aaa = page(client, "/ticker/AAA")
    assert aaa.find(id="tonight")["data-state"] == "rated"  # type: ignore[index]
    assert text(aaa.find(id="tonight")).startswith("Overweight score +0.40")
    assert "a rerun" in text(aaa.find(id="tonight")) and f"#{rerun}" in \
        text(aaa.find(id="tonight"))
    # BBB's rerun failed: the ranking keeps the night's Hold, and so does the headline.
    add_night(sqlite_engine, D2, DUE2 + timedelta(hours=7), {"BBB": Rated(error="boom")},
              kind="rerun")
    bbb = page(client, "/ticker/BBB")
    assert text(bbb.find(id="tonight")).startswith("Hold score +0.05")


def test_a_ticker_not_in_the_latest_night_says_its_latest_night(sqlite_engine: Engine,
                                                                client: TestClient) -> None:
    first = add_night(sqlite_engine, D1, DUE1, {"AAA": Rated(error="DataError: no prices"),
                                                "BBB": Rated("Hold", 0.0)})
    add_night(sqlite_engine, D2, DUE2, {"BBB": Rated("Hold", 0.0)})
    headline = text(page(client, "/ticker/AAA").find(id="tonight"))
    assert headline.startswith(f"Its latest night: failed in nightly batch #{first}")


def test_a_first_night_that_failed_is_named_with_nothing_to_rank(sqlite_engine: Engine,
                                                                 client: TestClient) -> None:
    only = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error="boom")}, status="failed",
                     error="every ticker failed")
    soup = page(client, "/")
    assert f"batch #{only} (as of {D2}), failed: every ticker failed; no finished night to " \
        "rank" in text(soup.find(id="banner"))
    assert soup.find(id="night")["data-status"] == "failed"  # type: ignore[index]
    with time_machine.travel(MORNING, tick=False):
        api = client.get("/api/ranking", auth=AUTH).json()
    assert api["night"]["status"] == "failed" and api["night"]["fresh"] is False
    assert api["night"]["latest"]["id"] == only


def test_the_running_night_s_eta_reads_the_same_on_both_faces(sqlite_engine: Engine,
                                                              client: TestClient) -> None:
    # Written alike by the page and the CLI, with its interval.
    now = DUE2 + timedelta(minutes=30, seconds=10)
    add_night(sqlite_engine, D1, DUE1, GOOD)
    running = add_night(sqlite_engine, D2, DUE2,
                        {"AAA": Rated("Buy", 0.7), "BBB": Rated(status="running"),
                         "CCC": Rated(status="queued"), "DDD": Rated(status="queued"),
                         "EEE": Rated("Buy", 0.7), "FFF": Rated("Buy", 0.7)},
                        status="running", heartbeat=now - timedelta(seconds=5))
    calls(sqlite_engine, running, "AAA", NODES, end=now - timedelta(minutes=5))
    for ticker in ("EEE", "FFF"):  # two at a time
        calls(sqlite_engine, running, ticker, NODES, end=now - timedelta(minutes=10))
    calls(sqlite_engine, running, "BBB", list(ANALYSTS), end=now)
    # The servers' output (600 tokens) made in the last minute, while BBB's analysts ran:
    # a first night's work is at least the output left at that rate.
    counter(sqlite_engine, running, [0.0, 0.0, 10.0, 10.0], now=now)
    progress = text(page(client, "/", now).select_one(".progress .eta"))
    with time_machine.travel(now, tick=False):
        cli = run_cli("ranking", env=UTC_ENV)
    # 47 calls left (BBB's 13 later ones, CCC's and DDD's 17), each node's calls having
    # had 4 s of the server alone and 2 s two at a time (tests/unit/support/eta_rows.py): 8/3 s
    # on the mean (an analyst 3 s: BBB's ran alone too): 13 × 8/3 + 2 × (4 × 3 + 13 × 8/3)
    # = 128 s; the interval at a first night's calibrated ratios (0.67, 1.80): 86 s and 230 s.
    assert eta.RATIO_FIRST == (0.67, 1.80)
    said = "about 2 min 08 s (75% interval: 1 min 26 s – 3 min 50 s) left"
    assert progress == said
    assert said in cli.stderr.splitlines()[1]


def test_the_cli_s_json_ranking_carries_the_api_s_night_status(sqlite_engine: Engine,
                                                               client: TestClient) -> None:
    first = add_night(sqlite_engine, D1, DUE1, GOOD)
    add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error="boom")}, status="failed",
              error="every ticker failed")
    with time_machine.travel(MORNING, tick=False):
        api = client.get("/api/ranking", auth=AUTH).json()
        cli = json.loads(run_cli("ranking", "--format", "json", env=UTC_ENV).stdout)
    assert cli["night"] == api["night"]  # one payload, every field (checked_at included)
    assert cli["night"]["status"] == "failed" and cli["night"]["ranked"]["id"] == first
    assert cli["batch"] == api["batch"]
    # The rows too: the page's ranked rows are the CLI's, the unranked follow in the CLI's.
    assert cli["rows"][:len(api["rows"])] == api["rows"]
    assert [r["ticker"] for r in cli["rows"]] == ["AAA", "BBB"]


def test_batches_read_the_same_on_the_api_and_the_cli(sqlite_engine: Engine,
                                                      client: TestClient) -> None:
    add_night(sqlite_engine, D1, DUE1, GOOD, minutes=40)
    add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Buy", 0.7), "BBB": Rated(status="running")},
              status="running", heartbeat=DUE2 + timedelta(minutes=25))
    with time_machine.travel(DUE2 + timedelta(minutes=26), tick=False):
        api = client.get("/api/batches", auth=AUTH).json()
        cli = json.loads(run_cli("batches", "--format", "json").stdout)
    assert api == cli  # same keys, same values, newest first
    # A running batch's duration runs to now, not to its last heartbeat.
    assert [b["duration_s"] for b in cli] == [26 * 60.0, 40 * 60.0]
    assert cli[0]["tickers"] == "1/2" and cli[0]["status"] == "running"


def test_the_page_s_changes_are_nightdesk_changes(sqlite_engine: Engine,
                                                  client: TestClient) -> None:
    add_night(sqlite_engine, D1, DUE1, {"AAA": Rated("Hold", 0.0), "BBB": Rated("Buy", 0.7)})
    add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Buy", 0.6), "BBB": Rated("Sell", -0.8),
                                        "DDD": Rated("Hold", 0.1)})
    with time_machine.travel(MORNING, tick=False):
        api = client.get("/api/ranking", auth=AUTH).json()
        cli = json.loads(run_cli("changes", "--format", "json", env=UTC_ENV).stdout)
    assert api["changes"] == cli
    assert [c["ticker"] for c in cli["changes"]] == ["BBB", "AAA", "DDD"]
    shown = {r["ticker"]: (r["change"], r["previous_rating"]) for r in api["rows"]}
    assert shown == {"AAA": ("upgrade", "Hold"), "BBB": ("downgrade", "Buy"), "DDD": ("new", None)}


def test_a_resumed_nights_page_gives_tok_s_over_the_time_it_ran(sqlite_engine: Engine,
                                                                client: TestClient) -> None:
    night = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated("Buy", 0.7)}, minutes=130)
    add_resumed_calls(sqlite_engine, night, DUE2)
    soup = page(client, f"/batches/{night}")
    # 16,000 tokens over the 200 s its calls ran, not over the 2 h 03 min 20 s makespan.
    assert text(soup.find(id="throughput-value")) == "80.0"
    assert text(soup.find(id="paused")).startswith("of it 2 h 00 min paused (1 pause:")


def test_a_partial_night_whose_failures_reruns_redid_has_no_partial_banner(
        sqlite_engine: Engine, client: TestClient) -> None:
    add_night(sqlite_engine, D1, DUE1, GOOD)
    add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error="HTTP 400: bad"),
                                        "BBB": Rated("Hold", 0.05)})
    banner = text(page(client, "/").find(id="banner"))
    assert banner.startswith("A partial night.") and "1 of its tickers has no rating" in banner
    # AAA's rerun of that night succeeded: every ticker has a rating, so the page has no
    # unrated ticker to name (it said "0 of its tickers have no rating (listed below)").
    add_night(sqlite_engine, D2, DUE2 + timedelta(hours=6), {"AAA": Rated("Overweight", 0.4)},
              kind="rerun")
    soup = page(client, "/")
    assert soup.find(id="banner") is None
    assert soup.find(id="night")["data-status"] == "partial"  # type: ignore[index]


def test_the_partial_banner_counts_its_unrated_tickers_in_number(
        sqlite_engine: Engine, client: TestClient) -> None:
    # It said "1 of its tickers have no rating": the verb agrees with the count.
    add_night(sqlite_engine, D1, DUE1, GOOD)
    add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error="HTTP 400: bad"),
                                        "BBB": Rated(error="HTTP 400: bad"),
                                        "CCC": Rated("Hold", 0.05)})
    assert "2 of its tickers have no rating" in text(page(client, "/").find(id="banner"))
    add_night(sqlite_engine, D2, DUE2 + timedelta(hours=6), {"AAA": Rated("Overweight", 0.4)},
              kind="rerun")
    assert "1 of its tickers has no rating" in text(page(client, "/").find(id="banner"))


def test_a_stopped_nights_tickers_without_a_result_are_not_headed_failed(
        sqlite_engine: Engine, client: TestClient) -> None:
    # A night stopped by SIGTERM: one ticker rated, one failed, two left "interrupted" (as
    # ``store.finish_batch`` leaves them). `report` and the summary line call those two not
    # finished; the page heads its list as `report` does, not "Failed tickers".
    stopped = add_night(sqlite_engine, D2, DUE2,
                        {"AAA": Rated("Buy", 0.7), "EEE": Rated(error="DataError: x"),
                         "BBB": Rated(status="interrupted", error="stopped by SIGTERM"),
                         "CCC": Rated(status="interrupted", error="stopped by SIGTERM")},
                        status="interrupted", error="stopped by SIGTERM")
    soup = page(client, f"/batches/{stopped}")
    assert [text(tr.find("td")) for tr in soup.select("#failed tbody tr")] == [
        "BBB", "CCC", "EEE"]
    heading = text(soup.select_one("#failed").find_previous("h2"))
    cli = run_cli("report", str(stopped), env=UTC_ENV).stdout
    assert heading == "Tickers without a result"
    assert "tickers without a result (3):" in cli
    # A night whose every unrated ticker failed keeps the heading.
    failed = add_night(sqlite_engine, D1, DUE1, {"AAA": Rated("Buy", 0.7),
                                                 "EEE": Rated(error="DataError: x")})
    assert text(page(client, f"/batches/{failed}").select_one("#failed")
                .find_previous("h2")) == "Failed tickers"
