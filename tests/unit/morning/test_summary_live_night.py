"""A night whose heartbeat is held up but whose calls are still being recorded reads running
on every surface; once its calls stop too it reads crashed everywhere, as before.

A call that ended is a sign of life as good as a heartbeat: it ends only in a live process
(docs/lab/2026-12-07-live-night-status.md has the fault this guards against).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.config import load_settings
from app.morning import nightstatus
from app.runs.resumable import mark_stale_crashed
from tests.unit.support.night_rows import ELSEWHERE, Rated, add_night, run_by
from tests.unit.support.surfaces import every_surface

STALE_S = 120.0  # heartbeat_stale_s, the default the CLI and the pages read


def _night(engine: Engine, beat_age_s: float, call_age_s: float) -> int:
    """A nightly batch run on another host (its pid cannot be looked up, SQLite's lock not
    read from here): its heartbeat ``beat_age_s`` old, its last call ended ``call_age_s`` ago."""
    now = datetime.now(UTC)
    return add_night(engine, now.date(), now - timedelta(minutes=6),
                     {"AAA": Rated(status="running"), "BBB": Rated(status="running")},
                     status="running", heartbeat=now - timedelta(seconds=beat_age_s),
                     settings=run_by(ELSEWHERE),
                     last_call=("AAA", now - timedelta(seconds=call_age_s)))


def test_a_night_whose_heartbeat_is_held_up_but_whose_calls_go_on_reads_running_everywhere(
        sqlite_engine: Engine, client: TestClient) -> None:
    # Its heartbeat 5 min old (stale after 2), its last call 5 s ago: it lives.
    night = _night(sqlite_engine, beat_age_s=300, call_age_s=5)
    said = every_surface(sqlite_engine, client, night, load_settings())
    assert set(said.values()) == {"running"}, said
    # No "no word from the night": its calls are word from it.
    prog = nightstatus.progress(sqlite_engine, night)
    assert "no word" not in (prog.estimating or ""), prog


def test_a_night_whose_calls_stopped_too_reads_crashed_everywhere(
        sqlite_engine: Engine, client: TestClient) -> None:
    # The same night, its last call as old as its heartbeat's stale bound allows and more.
    night = _night(sqlite_engine, beat_age_s=300, call_age_s=130)
    said = every_surface(sqlite_engine, client, night, load_settings())
    assert said.pop("running list") == "absent" and said.pop("running_night") == "none"
    assert set(said.values()) == {"crashed"}, said


@pytest.mark.parametrize(("beat_age_s", "call_age_s", "marked"),
                         [(300, 5, []), (300, 130, [1]), (5, 300, [])])
def test_marking_reads_a_night_as_every_view_does(
        sqlite_engine: Engine, beat_age_s: float, call_age_s: float, marked: list[int]) -> None:
    # A later start (or `report`) marks only the nights every view reads crashed.
    _night(sqlite_engine, beat_age_s, call_age_s)
    assert mark_stale_crashed(sqlite_engine, STALE_S) == marked
