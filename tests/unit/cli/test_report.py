"""`nightdesk batches` and the head of `nightdesk report`: status, as-of, tickers n/m, duration.

Stored: night 1 (D1) succeeded, 2 of 2, 40 min; night 2 (D2) partial, 2 of 3 (CCC failed with
"LLMTimeoutError: no answer"), 90 min; a rerun of CCC (D2) succeeded, 1 of 1, 5 min; night 3
(D3) running, 1 of 3 done (BBB running, CCC queued), heartbeat 10 min after its start.
"""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import date, timedelta

import pytest
import time_machine
from sqlalchemy import Engine

from tests.unit.support.clirun import run_cli
from tests.unit.support.night_rows import Rated, add_night, at

D1, D2, D3 = date(2026, 11, 26), date(2026, 11, 27), date(2026, 11, 28)


def stored(engine: Engine) -> dict[str, int]:
    ids = {
        "night1": add_night(engine, D1, at(D2, 0, 10), {"AAA": Rated("Buy", 0.8),
                                                        "BBB": Rated("Hold", 0.0)}),
        "night2": add_night(engine, D2, at(D3, 0, 10), {
            "AAA": Rated("Buy", 0.7), "BBB": Rated("Hold", 0.1),
            "CCC": Rated(error="LLMTimeoutError: no answer")}, minutes=90),
        "rerun": add_night(engine, D2, at(D3, 7, 0), {"CCC": Rated("Sell", -0.6)},
                           kind="rerun", minutes=5),
    }
    started = at(date(2026, 11, 29), 0, 10)
    ids["night3"] = add_night(engine, D3, started, {
        "AAA": Rated("Buy", 0.7), "BBB": Rated(status="running"), "CCC": Rated(status="queued")},
        status="running", heartbeat=started + timedelta(minutes=10))
    return ids


def test_batches_as_json_lists_the_newest_first(sqlite_engine: Engine) -> None:
    ids = stored(sqlite_engine)
    result = run_cli("batches", "--format", "json")
    assert result.code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["id"] for r in rows] == [ids["night3"], ids["rerun"], ids["night2"],
                                       ids["night1"]]
    by_id = {r["id"]: r for r in rows}
    assert {k: by_id[ids["night2"]][k] for k in ("kind", "status", "as_of", "tickers",
                                                 "tickers_failed", "duration_s")} == {
        "kind": "nightly", "status": "partial", "as_of": str(D2), "tickers": "2/3",
        "tickers_failed": 1, "duration_s": 90 * 60.0}
    # Still marked running, but its heartbeat is days old now: crashed, as in every view,
    # and its duration runs to that last heartbeat.
    dead = by_id[ids["night3"]]
    assert (dead["status"], dead["tickers"], dead["duration_s"]) == ("crashed", "1/3", 600.0)
    assert by_id[ids["rerun"]]["kind"] == "rerun"


def test_batches_filters_by_kind_and_limit(sqlite_engine: Engine) -> None:
    ids = stored(sqlite_engine)
    nightly = json.loads(run_cli("batches", "--kind", "nightly", "--limit", "2",
                                 "--format", "json").stdout)
    assert [r["id"] for r in nightly] == [ids["night3"], ids["night2"]]
    reruns = json.loads(run_cli("batches", "--kind", "rerun", "--format", "json").stdout)
    assert [r["id"] for r in reruns] == [ids["rerun"]]


def test_batches_as_csv_and_table(sqlite_engine: Engine) -> None:
    ids = stored(sqlite_engine)
    rows = list(csv.DictReader(io.StringIO(run_cli("batches", "--format", "csv").stdout)))
    night2 = next(r for r in rows if r["id"] == str(ids["night2"]))
    assert (night2["status"], night2["tickers"], night2["duration_s"], night2["error"]) == (
        "partial", "2/3", "5400.0", "")
    table = run_cli("batches").stdout
    line = next(line for line in table.splitlines() if f" {ids['night2']} " in line)
    for cell in ("nightly", "partial", str(D2), "2/3", "1 h 30 min"):
        assert cell in line, (cell, line)


def test_the_batches_tables_start_time_names_its_zone(sqlite_engine: Engine,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The time is UTC's on any host; a bare "07:28" read on a host in Tokyo is nine hours off.
    ids = stored(sqlite_engine)
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        table = run_cli("batches").stdout
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    header = next(line for line in table.splitlines() if " id " in line)
    assert "started (UTC)" in header, header
    started = run_cli("batches", "--format", "json").stdout
    night = next(b for b in json.loads(started) if b["id"] == ids["night2"])
    line = next(line for line in table.splitlines() if f" {ids['night2']} " in line)
    assert night["started_at"][:16].replace("T", " ") in line, (night["started_at"], line)


@pytest.mark.parametrize("argv", [
    ["batches", "--kind", "bench"], ["batches", "--limit", "0"],
    ["batches", "--format", "xml"], ["report", "999"], ["report", "nine"],
    ["report", "1", "--compare", "1,2"],  # the id went unread: the comparison was printed
    ["report", "--compare", "1,,2"],  # the empty item was skipped unsaid
])
def test_bad_input_is_one_line_and_exit_2(sqlite_engine: Engine, argv: list[str]) -> None:
    stored(sqlite_engine)
    result = run_cli(*argv)
    assert result.code == 2, result.stderr
    assert len(result.error_lines) == 1 and result.error_lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_no_batches_yet_is_said(sqlite_engine: Engine) -> None:
    result = run_cli("batches", "--format", "json")
    assert result.code == 0 and json.loads(result.stdout) == []


def test_report_heads_with_status_as_of_duration_and_the_failed_tickers(
        sqlite_engine: Engine) -> None:
    ids = stored(sqlite_engine)
    result = run_cli("report", str(ids["night2"]))
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (f"DEMO DATA batch {ids['night2']} (nightly, as of {D2}): partial — "
                        "2 of 3 tickers succeeded, 1 failed; duration 1 h 30 min")
    # CCC's rerun (D2) succeeded and the ranking applies it: nothing left to advise, and
    # the failure is listed with the rerun that rated it since.
    assert lines[1:3] == ["failed tickers (1):", f"  CCC (failed, rated since by rerun "
                                                 f"#{ids['rerun']}): LLMTimeoutError: no answer"]
    data = json.loads(run_cli("report", str(ids["night2"]), "--format", "json").stdout)
    assert data["batch"]["status"] == "partial" and data["batch"]["as_of"] == str(D2)
    assert data["batch"]["duration_s"] == 5400.0
    assert data["failed_tickers"] == [{"ticker": "CCC", "status": "failed",
                                       "error": "LLMTimeoutError: no answer",
                                       "rated_by": ids["rerun"]}]


def test_a_running_batch_lists_no_running_ticker_as_failed(sqlite_engine: Engine) -> None:
    ids = stored(sqlite_engine)
    # A minute after its last heartbeat: alive, so `report` leaves it running.
    with time_machine.travel(at(date(2026, 11, 29), 0, 21), tick=False):
        data = json.loads(run_cli("report", str(ids["night3"]), "--format", "json").stdout)
    assert data["batch"]["status"] == "running" and data["failed_tickers"] == []


def test_report_gives_the_calls_start_and_end_in_utc_and_a_dash_when_none_ran(
        sqlite_engine: Engine) -> None:
    # A night refused or failed before its first call has no first call: "—", as every other
    # missing figure, not Python's "None"; one that ran gives its first call's start and
    # last call's end to the second, in UTC, as the batch's page does.
    start = at(D3, 0, 10)
    none_ran = add_night(sqlite_engine, D2, start, {"AAA": Rated(error="server gone")})
    ran = add_night(sqlite_engine, D3, start, {"AAA": Rated("Buy", 0.5)}, calls=3)
    env = {"COLUMNS": "200"}

    def row(batch_id: int, key: str) -> list[str]:
        out = run_cli("report", str(batch_id), env=env).stdout
        [line] = [line for line in out.splitlines() if f" {key} " in line]
        return [cell.strip() for cell in line.strip("│ ").split("│")]

    assert row(none_ran, "first call start") == ["first call start", "—"]
    assert row(none_ran, "last call end") == ["last call end", "—"]
    assert row(ran, "first call start") == ["first call start", "2026-11-28 00:10:00 UTC"]
    assert row(ran, "last call end") == ["last call end", "2026-11-28 00:10:03 UTC"]
