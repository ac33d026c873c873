"""Every command that offers ``--format table|json|csv`` tells the same facts in JSON and CSV.

A CSV is flat: what the JSON gives once (the plan's floor, the nights a `changes` compares,
the batch a ranking is of) rides on every row, an object's keys one level down as
``parent_key``. The check compares the key sets of the two formats for every such command,
so a field added to the JSON and not to the CSV (or the reverse) fails here.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import date, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.unit.support.clirun import run_cli
from tests.unit.support.night_rows import Rated, add_night, at

TONIGHT = date(2026, 11, 27)
# Each command: its arguments, the JSON's list its CSV rows are (None: the JSON is that list),
# the JSON keys the rows stand for, the columns' other word for an object, and the names
# kept from before the CSV carried every fact.
COMMANDS: dict[str, tuple[tuple[str, ...], str | None, set[str], dict[str, str],
                          dict[str, str]]] = {
    # With a deadline, so that it is an object (a plan without one: the test below).
    "plan": (("plan", "--tickers", "7", "--deadline", "06:00"), "rows", set(), {}, {}),
    "ranking": (("ranking",), "rows", set(), {"batch": "ranked"},
                {"night_fresh": "fresh", "ranked_demo": "demo"}),
    "changes": (("changes",), "changes", {"tickers"}, {}, {}),
    "batches": (("batches",), None, set(), {}, {}),
}


def _expected(data: Any, rows: str | None, left: set[str], prefixes: dict[str, str],
              renamed: dict[str, str]) -> set[str]:
    """Return the columns a CSV of this JSON must have: the rows' keys, and each other key
    of the object, an object's keys as ``parent_key``."""
    items = data if rows is None else data[rows]
    assert items, "the check needs rows to read their keys"
    columns = set().union(*(item.keys() for item in items))
    for key, fact in ({} if rows is None else data).items():
        if key == rows or key in left:
            continue
        names = ([f"{prefixes.get(key, key)}_{inner}" for inner in fact]
                 if isinstance(fact, dict) else [key])
        columns |= {renamed.get(name, name) for name in names}
    return columns


@pytest.mark.parametrize("command", list(COMMANDS))
def test_csv_carries_every_fact_of_the_json(sqlite_engine: Engine, command: str) -> None:
    add_night(sqlite_engine, TONIGHT - timedelta(days=1), at(TONIGHT, 0, 10) - timedelta(days=1),
              {"AAA": Rated("Buy", 0.6), "BBB": Rated("Hold", 0.0)})
    add_night(sqlite_engine, TONIGHT, at(TONIGHT, 0, 10),
              {"AAA": Rated("Hold", 0.1), "BBB": Rated("Buy", 0.7)})
    argv, rows, left, prefixes, renamed = COMMANDS[command]
    as_json = run_cli(*argv, "--format", "json")
    as_csv = run_cli(*argv, "--format", "csv")
    assert (as_json.code, as_csv.code) == (0, 0), as_json.stderr + as_csv.stderr
    header = next(csv.reader(io.StringIO(as_csv.stdout)))
    assert len(header) == len(set(header))
    assert set(header) == _expected(json.loads(as_json.stdout), rows, left, prefixes, renamed)


def test_plan_csv_has_the_same_columns_with_a_deadline_or_without(sqlite_engine: Engine) -> None:
    """A script reading several plans' CSV meets one header, and the floor on each row."""
    headers, floors = [], []
    for extra in ((), ("--deadline", "06:00")):
        text = run_cli("plan", "--tickers", "7", "--format", "csv", *extra).stdout
        found = list(csv.DictReader(io.StringIO(text)))
        headers.append(list(found[0]))
        floors.append({row["floor_s"] for row in found})
    plan = json.loads(run_cli("plan", "--tickers", "7", "--format", "json").stdout)
    assert headers[0] == headers[1]
    assert floors == [{str(plan["floor_s"])}] * 2


def test_changes_csv_has_the_same_columns_on_a_night_without_a_change(
        sqlite_engine: Engine) -> None:
    """Its rows are the changes, as the table's: a quiet night has none, and its header
    still names every column (the nights compared among them), so a script that reads
    `against_id` does not break on the nights nothing changed."""
    add_night(sqlite_engine, TONIGHT - timedelta(days=2), at(TONIGHT, 0, 10) - timedelta(days=2),
              {"AAA": Rated("Buy", 0.6), "BBB": Rated("Hold", 0.0)})
    moved = add_night(sqlite_engine, TONIGHT - timedelta(days=1),
                      at(TONIGHT, 0, 10) - timedelta(days=1),
                      {"AAA": Rated("Hold", 0.1), "BBB": Rated("Buy", 0.7)})
    quiet = add_night(sqlite_engine, TONIGHT, at(TONIGHT, 0, 10),
                      {"AAA": Rated("Hold", 0.1), "BBB": Rated("Buy", 0.7)})
    headers = []
    for night, changes in ((moved, 2), (quiet, 0)):  # each against the night before
        text = run_cli("changes", "--batch", str(night), "--format", "csv").stdout
        headers.append(next(csv.reader(io.StringIO(text))))
        assert len(list(csv.DictReader(io.StringIO(text)))) == changes, text
    assert headers[0] == headers[1] and "against_id" in headers[1]
