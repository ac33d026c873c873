"""One status of a night, and one duration, in every view: CLI, pages, API, /metrics, digest.

A night started at START whose process was SIGKILLed: its row still says running, its last
heartbeat is START + 60 s. Viewed at START + 60 s + 200 s, past ``heartbeat_stale_s`` (120 s),
every view names it crashed, with a duration of 60 s (to its last sign of life) and no
progress or time left. A live night (heartbeat START + 20 s) viewed at START + 23 s runs for
23 s in every view, though its heartbeat is 3 s older.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import time_machine
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, select, update

from app.config import load_settings
from app.db.models import Batch
from app.morning.digest import build_digest
from app.morning.nightstatus import span
from tests.unit.support.clirun import run_cli
from tests.unit.support.night_rows import Rated, add_night, at
from tests.unit.support.webclient import PASSWORD, USER

D1, D2 = date(2026, 11, 26), date(2026, 11, 27)
START = at(date(2026, 11, 28), 0, 10)  # the default schedule's due time of D2's night
ENV = {"NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}


def night_in_flight(engine: Engine, beat_after_s: float) -> int:
    """Store a finished night D1 and a night D2 marked running since START."""
    add_night(engine, D1, at(D2, 0, 10), {"AAA": Rated("Buy", 0.8), "BBB": Rated("Hold", 0.0)})
    return add_night(engine, D2, START, {"AAA": Rated("Buy", 0.7),
                                         "BBB": Rated(status="running"),
                                         "CCC": Rated(status="queued")},
                     status="running", heartbeat=START + timedelta(seconds=beat_after_s))


def seen(engine: Engine, client: TestClient, batch_id: int, now: datetime
         ) -> dict[str, tuple[str, float | None]]:
    """Return (status, duration) of the batch as each view gives it at ``now``."""
    views: dict[str, tuple[str, float | None]] = {}
    with time_machine.travel(now, tick=False):
        listed = {b["id"]: b for b in json.loads(run_cli("batches", "--format", "json",
                                                         env=ENV).stdout)}
        views["batches"] = (listed[batch_id]["status"], listed[batch_id]["duration_s"])
        ranking = json.loads(run_cli("ranking", "--format", "json", env=ENV).stdout)
        night = ranking["night"]["latest"]
        views["ranking"] = (ranking["night"]["status"], night["duration_s"])
        api = {b["id"]: b for b in client.get("/api/batches", auth=(USER, PASSWORD)).json()}
        views["/api/batches"] = (api[batch_id]["status"], api[batch_id]["duration_s"])
        one = client.get(f"/api/batches/{batch_id}", auth=(USER, PASSWORD)).json()
        views["/api/batches/N"] = (one["batch"]["status"], one["batch"]["duration_s"])
        api_night = client.get("/api/ranking", auth=(USER, PASSWORD)).json()["night"]
        views["/api/ranking"] = (api_night["status"], api_night["latest"]["duration_s"])
        page = BeautifulSoup(client.get("/batches", auth=(USER, PASSWORD)).text,
                             "html.parser")
        row = page.find("tr", attrs={"data-batch": str(batch_id)})
        assert row is not None
        cells = row.find_all("td")
        views["/batches"] = (cells[5]["data-value"], float(cells[7]["data-value"]))
        front = BeautifulSoup(client.get("/", auth=(USER, PASSWORD)).text, "html.parser")
        views["/"] = (front.find(id="night")["data-status"], None)  # type: ignore[index]
        scrape = client.get("/metrics", auth=(USER, PASSWORD)).text
        values = {(s.name, s.labels.get("status")): s.value
                  for f in text_string_to_metric_families(scrape) for s in f.samples}
        [status] = [name for (metric, name), v in values.items()
                    if metric == "nightdesk_night_last_status" and v == 1]
        views["/metrics"] = (status, values.get(("nightdesk_night_duration_seconds", None)))
        digest = build_digest(engine, load_settings(), batch_id).message.body
        views["digest"] = (digest.split(":")[1].strip(), None)
        # Last: `report` marks the dead batch crashed in its row.
        head = json.loads(run_cli("report", str(batch_id), "--format", "json",
                                  env=ENV).stdout)["batch"]
        views["report"] = (head["status"], head["duration_s"])
    return views


def test_a_sigkilled_night_reads_crashed_everywhere_with_one_duration(
        sqlite_engine: Engine, client: TestClient) -> None:
    night = night_in_flight(sqlite_engine, beat_after_s=60)
    # The digest too, from the same ``duration_s``: its end the last heartbeat.
    crashed_with_one_duration(sqlite_engine, client, night,
                              START + timedelta(seconds=60 + 200), 60.0)


def crashed_with_one_duration(engine: Engine, client: TestClient, night: int,
                              now: datetime, duration_s: float) -> None:
    """Assert that at ``now`` every view, and the digest, read ``night`` crashed, lasting
    ``duration_s``."""
    views = seen(engine, client, night, now)
    assert {view: status for view, (status, _) in views.items()} == dict.fromkeys(
        views, "crashed")
    assert {view: duration for view, (_, duration) in views.items()
            if duration is not None} == dict.fromkeys(
        ["batches", "ranking", "/api/batches", "/api/batches/N", "/api/ranking", "/batches",
         "/metrics", "report"], duration_s)
    with time_machine.travel(now, tick=False):
        digest = build_digest(engine, load_settings(), night).message.body
    assert f"Duration: {span(duration_s)};" in digest, digest


def test_a_night_killed_before_its_first_heartbeat_lasts_until_its_last_call_ended(
        sqlite_engine: Engine, client: TestClient) -> None:
    # Killed before it first beat: its row has only its start, but its calls ran for 40 s
    # (40 one-second calls, the last ending at START + 40 s). Its end is its last call's.
    add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Buy", 0.8)})
    night = add_night(sqlite_engine, D2, START, {"AAA": Rated(status="running"),
                                                 "BBB": Rated(status="queued"),
                                                 "CCC": Rated(status="queued")},
                      status="running", calls=40)
    with sqlite_engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == night).values(heartbeat_at=None))
    crashed_with_one_duration(sqlite_engine, client, night,
                              START + timedelta(seconds=40 + 200), 40.0)
    # ``report`` stored its end: the last call's, not its start.
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.finished_at).where(Batch.id == night)).scalar_one() \
            == START + timedelta(seconds=40)


def test_a_crashed_night_shows_no_progress_and_no_time_left(
        sqlite_engine: Engine, client: TestClient) -> None:
    night = night_in_flight(sqlite_engine, beat_after_s=60)
    with time_machine.travel(START + timedelta(seconds=60 + 200), tick=False):
        view = client.get("/api/ranking", auth=(USER, PASSWORD)).json()
        page = client.get("/", auth=(USER, PASSWORD)).text
        batch_page = client.get(f"/api/batches/{night}", auth=(USER, PASSWORD)).json()
    assert view["running"] == [] and view["night"]["progress"] is None
    assert "left" not in BeautifulSoup(page, "html.parser").get_text()
    assert batch_page["progress"] is None
    # Its tickers under way when it died are no longer "running" on its page.
    assert batch_page["running_tickers"] == []
    assert {t["ticker"] for t in batch_page["failed_tickers"]} == {"BBB", "CCC"}


def test_a_live_night_runs_for_the_time_since_its_start_in_every_view(
        sqlite_engine: Engine, client: TestClient) -> None:
    night = night_in_flight(sqlite_engine, beat_after_s=20)
    views = seen(sqlite_engine, client, night, START + timedelta(seconds=23))
    views.pop("report")  # `report` of a running batch: its status below, as the others
    assert {view: status for view, (status, _) in views.items()} == dict.fromkeys(
        views, "running")
    assert {view: duration for view, (_, duration) in views.items()
            if duration is not None} == dict.fromkeys(
        ["batches", "ranking", "/api/batches", "/api/batches/N", "/api/ranking", "/batches",
         "/metrics"], 23.0)
    with time_machine.travel(START + timedelta(seconds=23), tick=False):
        running = client.get("/api/ranking", auth=(USER, PASSWORD)).json()["running"]
    assert [(r["id"], r["elapsed_s"], r["duration_s"]) for r in running] == [(night, 23, 23.0)]


def test_a_killed_batch_says_the_same_before_and_after_a_command_marks_it_crashed(
        sqlite_engine: Engine) -> None:
    # Read commands mark a batch whose process died crashed in its row (``report`` does);
    # what every view says of it must not change with that write.
    created = datetime.now(UTC) - timedelta(hours=3)
    beat = created + timedelta(minutes=10)
    killed = add_night(sqlite_engine, date(2026, 11, 27), created,
                       {"AAA": Rated("Buy", 0.5), "BBB": Rated(status="running")},
                       status="running", heartbeat=beat)

    def said() -> tuple[str, str]:
        [row] = json.loads(run_cli("batches", "--format", "json").stdout)
        return row["status"], row["error"]

    before = said()
    assert before == ("crashed", f"no sign of life since {beat:%Y-%m-%d %H:%M} UTC: its process "
                                 "has died")
    report = run_cli("report", str(killed))
    assert "marked crashed" in report.stderr  # the row was written
    assert f"  error: {before[1]}" in report.stdout.splitlines()
    assert said() == before


def test_a_dead_nights_unfinished_tickers_read_interrupted_before_and_after_it_is_marked(
        sqlite_engine: Engine, client: TestClient) -> None:
    # Killed with BBB running and CCC queued. Before any command marks the row, the page and
    # the API listed them "running" and "queued" (under a night that reads crashed) and the
    # digest listed neither, though it said "2 not finished"; `report` marks the row and then
    # says "interrupted: the batch's process died". One account of them, before and after.
    night = night_in_flight(sqlite_engine, beat_after_s=60)
    died = [{"ticker": "BBB", "status": "interrupted", "error": "the batch's process died",
             "rated_by": None},
            {"ticker": "CCC", "status": "interrupted", "error": "the batch's process died",
             "rated_by": None}]
    now = START + timedelta(seconds=60 + 200)
    with time_machine.travel(now, tick=False):
        before = client.get(f"/api/batches/{night}", auth=(USER, PASSWORD)).json()
        page = BeautifulSoup(client.get(f"/batches/{night}", auth=(USER, PASSWORD)).text,
                             "html.parser")
        digest = build_digest(sqlite_engine, load_settings(), night).message.body
        report = json.loads(run_cli("report", str(night), "--format", "json",
                                    env=ENV).stdout)
        after = client.get(f"/api/batches/{night}", auth=(USER, PASSWORD)).json()
    assert before["failed_tickers"] == died
    assert [[td.get_text(strip=True) for td in tr.find_all("td")]
            for tr in page.select("#failed tbody tr")] == [
        ["BBB", "interrupted", "the batch's process died"],
        ["CCC", "interrupted", "the batch's process died"]]
    assert "Not finished (2):\n  2 tickers (BBB, CCC): the batch's process died" in digest, digest
    assert report["failed_tickers"] == died and after["failed_tickers"] == died
