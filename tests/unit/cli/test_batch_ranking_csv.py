"""`nightdesk ranking --format csv` says what the JSON says of the night, on every row.

A script that reads only the CSV learnt a failed, crashed or stale night from stderr or from
``--require-fresh``'s exit code; each row now carries the latest night's status and whether
the ranking is of it, the values of the JSON's ``night.status`` and ``night.fresh``.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import date, timedelta

import pytest
import time_machine
from sqlalchemy import Engine

from tests.unit.support.clirun import run_cli
from tests.unit.support.night_rows import Rated, add_night, at

TONIGHT = date(2026, 11, 27)
ENDINGS = {  # tonight's tickers, stored status, heartbeat (None: at its end)
    "succeeded": ({"AAA": Rated("Buy", 0.5), "BBB": Rated("Hold", 0.1)}, None, False),
    "partial": ({"AAA": Rated("Buy", 0.5), "BBB": Rated(error="DataError: x")}, None, False),
    "failed": ({"AAA": Rated(error="DataError: x"), "BBB": Rated(error="DataError: x")},
               None, False),
    "interrupted": ({"AAA": Rated("Buy", 0.5), "BBB": Rated(status="interrupted")},
                    "interrupted", False),
    "crashed": ({"AAA": Rated("Buy", 0.5), "BBB": Rated(status="running")}, "running", True),
    "stale": (None, None, False),  # no night since the due time
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_each_csv_row_carries_the_nights_status_as_the_json_does(
        sqlite_engine: Engine, ending: str) -> None:
    add_night(sqlite_engine, TONIGHT - timedelta(days=2), at(TONIGHT, 0, 10) - timedelta(days=2),
              {"AAA": Rated("Buy", 0.6), "BBB": Rated("Hold", 0.0)})
    tickers, status, killed = ENDINGS[ending]
    if tickers is not None:
        add_night(sqlite_engine, TONIGHT, at(TONIGHT, 0, 10), tickers, status=status,
                  heartbeat=at(TONIGHT, 0, 20) if killed else None)
    env = {"NIGHTDESK_SCHEDULE_CRON": "10 0 * * *", "NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
    with time_machine.travel(at(TONIGHT, 8, 0), tick=False):
        night = json.loads(run_cli("ranking", "--format", "json", env=env).stdout)["night"]
        text = run_cli("ranking", "--format", "csv", env=env).stdout
    assert (night["status"], night["fresh"]) == (ending, ending in ("succeeded", "partial"))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows
    assert {(row["night_status"], row["fresh"]) for row in rows} == {
        (ending, str(night["fresh"]))}
