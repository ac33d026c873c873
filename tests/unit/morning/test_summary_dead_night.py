"""A night whose process is gone reads crashed at once, on every surface; a silent one shows
no time left.

Before, a night killed by SIGKILL read `running`, with an ETA shrinking by the clock, until
its heartbeat was 120 s old. Its runner (host, pid, start) is in its row: on this host a
pid that is gone proves it dead now. A night that may live but has missed two heartbeats
shows "no word from the night for N s" instead of a time left.
"""

from __future__ import annotations

import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.config import load_settings
from app.db.runner import Runner
from app.morning import nightstatus
from app.morning.advice import running_night
from app.morning.summary import list_batches
from app.runs.resumable import mark_stale_crashed
from tests.unit.support.clirun import run_cli
from tests.unit.support.night_rows import ELSEWHERE, Rated, add_night, run_by
from tests.unit.support.webclient import AUTH


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _night(engine: Engine, runner: dict[str, object], beat_age_s: float) -> int:
    now = datetime.now(UTC)
    return add_night(engine, now.date(), now - timedelta(minutes=5),
                     {"AAA": Rated(status="running"), "BBB": Rated(status="running")},
                     status="running", heartbeat=now - timedelta(seconds=beat_age_s),
                     settings=run_by(runner))


def test_a_night_whose_process_is_gone_reads_crashed_at_once_everywhere(
        sqlite_engine: Engine, client: TestClient) -> None:
    pid = _dead_pid()
    night = _night(sqlite_engine, {"host": socket.gethostname(), "pid": pid, "started": None},
                   beat_age_s=3)  # beat 3 s ago: the heartbeat alone says nothing yet
    why = f"its process {pid} is gone"
    [listed] = list_batches(sqlite_engine, 120.0)
    assert (listed.status, listed.error) == ("crashed", why)
    status = nightstatus.night_status(sqlite_engine, load_settings(), None)
    assert status.status == "crashed" and status.progress is None, status.headline
    assert running_night(sqlite_engine, 120.0) is None
    api = client.get("/api/batches", auth=AUTH).json()
    assert [(b["id"], b["status"], b["error"]) for b in api] == [(night, "crashed", why)]
    ranking = client.get("/api/ranking", auth=AUTH).json()
    assert ranking["night"]["status"] == "crashed" and ranking["running"] == []
    assert client.get(f"/api/batches/{night}", auth=AUTH).json()["batch"]["status"] == "crashed"
    metrics = client.get("/metrics", auth=AUTH).text
    assert 'nightdesk_night_last_status{status="crashed"} 1' in metrics
    assert "nightdesk_night_eta_seconds" not in metrics
    said = run_cli("batches", "--format", "json")
    assert said.code == 0 and '"status": "crashed"' in said.stdout, said


def test_a_live_night_is_still_running(sqlite_engine: Engine) -> None:
    _night(sqlite_engine, Runner.current().model_dump(), beat_age_s=3)
    [listed] = list_batches(sqlite_engine, 120.0)
    assert listed.status == "running"
    assert nightstatus.night_status(sqlite_engine, load_settings(), None).progress is not None


def test_a_live_night_is_not_taken_for_dead_when_the_wall_clock_steps_forward(
        sqlite_engine: Engine) -> None:
    # Its heartbeat 160 s old by the wall clock, which was stepped 150 s forward since it
    # recorded itself (an NTP step at boot, a VM resumed): 10 s old in fact. Before, every
    # view read it crashed until its next beat, and `report` stored it so for the rest of
    # the night (its tickers interrupted, a resume advised that the lock refused).
    me = Runner.current()
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)  # as the wall clock reads it
    stepped = {**me.model_dump(), "booted": booted - 150.0}
    night = _night(sqlite_engine, stepped, beat_age_s=160)
    [listed] = list_batches(sqlite_engine, 120.0)
    assert listed.status == "running"
    assert mark_stale_crashed(sqlite_engine, 120.0) == []
    # The step forgives only itself: 40 s past it is silence, and a hung night reads dead.
    hung = _night(sqlite_engine, stepped, beat_age_s=150 + 121)
    assert {b.id: b.status for b in list_batches(sqlite_engine, 120.0)} == {
        night: "running", hung: "crashed"}
    # Without a step, the hung-process rule stands as it was.
    unstepped = _night(sqlite_engine, me.model_dump(), beat_age_s=160)
    assert mark_stale_crashed(sqlite_engine, 120.0) == [hung, unstepped]


def test_a_silent_night_shows_no_time_left_but_how_long_it_has_been_silent(
        sqlite_engine: Engine, client: TestClient) -> None:
    # On another host: its pid cannot be looked up, and SQLite's lock cannot be read from
    # here; its heartbeat is 70 s old, two beats of 30 s missed, not yet 120 s stale.
    night = _night(sqlite_engine, ELSEWHERE, beat_age_s=70)
    says = "unknown: no word from the night for 1 min 1"  # 10 s, or 11 by the time it reads
    prog = nightstatus.progress(sqlite_engine, night)
    assert prog.eta_s is None and (prog.estimating or "").startswith(says), prog
    status = nightstatus.night_status(sqlite_engine, load_settings(), None)
    assert status.status == "running" and f"time left {says}" in status.headline
    assert f"time left {says}" in client.get("/", auth=AUTH).text
    assert "nightdesk_night_eta_seconds" not in client.get("/metrics", auth=AUTH).text
    # One beat late is no silence: the ETA's own words stand.
    fresh = _night(sqlite_engine, ELSEWHERE, beat_age_s=40)
    assert "no word" not in (nightstatus.progress(sqlite_engine, fresh).estimating or "")


def test_a_pid_of_another_pid_namespace_is_not_taken_for_gone(sqlite_engine: Engine) -> None:
    # The same host name, another pid namespace (a container, a unit with PrivatePIDs): its
    # pid cannot be looked up from here, so only its heartbeat tells.
    _night(sqlite_engine, {"host": socket.gethostname(), "pid": _dead_pid(), "started": None,
                           "pidns": "pid:[1]"}, beat_age_s=3)
    [listed] = list_batches(sqlite_engine, 120.0)
    assert listed.status == "running"
    assert Runner.current().pidns is not None  # what a run records of itself
