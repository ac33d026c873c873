"""The latest night's status: named whatever its outcome, stale when none came, and the CLI's face.

Each case builds its nights with ``night_rows`` on a frozen clock; the schedule is the
default 00:10 in UTC, so "the night due" on 2026-11-28 is 2026-11-28 00:10 UTC.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import pytest
import time_machine
from sqlalchemy import Engine, select

from agents.nodes import ANALYSTS
from app.config import Settings, load_settings
from app.db.models import SchedulerBeat
from app.morning.nightstatus import STALE_EXIT, NightStatus, night_status
from app.morning.ranking import ranked_night
from app.morning.timetable import due_times, nightly_trigger
from app.runs.daemon import Heartbeat
from tests.unit.support.clirun import run_cli
from tests.unit.support.eta_rows import NODES, calls
from tests.unit.support.night_rows import Rated, add_night, at

D1, D2 = date(2026, 11, 26), date(2026, 11, 27)
DUE1, DUE2 = at(date(2026, 11, 27), 0, 10), at(date(2026, 11, 28), 0, 10)
UTC_ENV = {"NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
GOOD = {"AAA": Rated("Buy", 0.8), "BBB": Rated("Hold", 0.0)}


def settings() -> Settings:
    return load_settings(schedule_timezone="UTC")


def status_at(engine: Engine, now: datetime) -> NightStatus:
    return night_status(engine, settings(), ranked_night(engine), now=now)


def test_due_times_follow_the_cron_in_its_zone() -> None:
    trigger = nightly_trigger(load_settings(schedule_timezone="Europe/Berlin"))
    last, following = due_times(trigger, datetime(2026, 11, 28, 8, 0, tzinfo=UTC))
    # 00:10 Berlin is 23:10 UTC the day before, in winter.
    assert last == datetime(2026, 11, 27, 23, 10, tzinfo=UTC)
    assert following == datetime(2026, 11, 28, 23, 10, tzinfo=UTC)


def test_a_good_night_is_fresh_and_named(sqlite_engine: Engine) -> None:
    first = add_night(sqlite_engine, D1, DUE1, GOOD)
    status = status_at(sqlite_engine, DUE1 + timedelta(hours=8))
    assert (status.status, status.fresh, status.reason) == ("succeeded", True, None)
    assert status.latest is not None and status.latest.id == first
    assert f"#{first}" in status.headline and "2 of 2 tickers" in status.headline
    assert status.due_at == DUE1 and status.next_due_at == DUE2


def test_a_partial_night_is_fresh_and_says_n_of_m(sqlite_engine: Engine) -> None:
    add_night(sqlite_engine, D1, DUE1, {**GOOD, "CCC": Rated(error="LLMTimeoutError")})
    status = status_at(sqlite_engine, DUE1 + timedelta(hours=8))
    assert status.status == "partial" and status.fresh
    assert "partial: 2 of 3 tickers" in status.headline


@pytest.mark.parametrize(("state", "error", "words"), [
    ("failed", "preflight: model not served", "failed: preflight: model not served"),
    ("interrupted", "SIGTERM", "was interrupted: SIGTERM; this ranking"),
    ("crashed", "no heartbeat for more than 120 s", "crashed: no heartbeat"),
])
def test_a_night_that_did_not_finish_leaves_an_older_ranking_named_as_such(
        sqlite_engine: Engine, state: str, error: str, words: str) -> None:
    first = add_night(sqlite_engine, D1, DUE1, GOOD)
    second = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error=error, status="failed"),
                                                 "BBB": Rated(status="queued")},
                       status=state, error=error)
    status = status_at(sqlite_engine, DUE2 + timedelta(hours=8))
    assert status.status == state and not status.fresh
    assert status.latest is not None and status.latest.id == second
    assert status.ranked is not None and status.ranked.id == first
    assert status.reason is not None and words in status.reason
    assert f"this ranking is of {D1} (batch #{first})" in status.reason
    # BBB is left to do: the advice is the resume that takes it up, given once, apart.
    assert [step.command for step in status.advice] == [f"nightdesk run --resume {second}"]
    assert "--resume" not in status.reason


def test_no_batch_since_the_due_time_is_stale_after_the_grace(sqlite_engine: Engine) -> None:
    first = add_night(sqlite_engine, D1, DUE1, GOOD)
    # Within the start grace (15 min) the night is not missing yet.
    assert status_at(sqlite_engine, DUE2 + timedelta(minutes=5)).status == "succeeded"
    status = status_at(sqlite_engine, DUE2 + timedelta(hours=8))
    assert status.status == "stale" and not status.fresh
    assert status.reason is not None and status.reason.startswith(
        "stale: no nightly batch since the night due 2026-11-28 00:10 UTC")
    assert f"batch #{first}" in status.headline


def test_an_older_date_analyzed_again_is_not_the_latest_night(sqlite_engine: Engine) -> None:
    # `nightdesk run --as-of <an older date>` in the morning: it ran after the due time and
    # finished last, so the morning took it for the latest night: a night that never came
    # read fresh (and `--require-fresh` 0) on a ranking two dates old.
    first = add_night(sqlite_engine, D1, DUE1, GOOD)
    add_night(sqlite_engine, D1 - timedelta(days=1), DUE2 + timedelta(hours=2), GOOD)
    status = status_at(sqlite_engine, DUE2 + timedelta(hours=8))
    assert (status.status, status.fresh) == ("stale", False), status.headline
    assert status.ranked is not None and status.ranked.id == first
    with time_machine.travel(DUE2 + timedelta(hours=8), tick=False):
        assert run_cli("ranking", "--require-fresh", env=UTC_ENV).code == STALE_EXIT
    # Tonight's night came and succeeded; the older date analyzed again after it failed.
    tonight = add_night(sqlite_engine, D2, DUE2, GOOD)
    add_night(sqlite_engine, D1 - timedelta(days=2), DUE2 + timedelta(hours=3),
              {"AAA": Rated(error="LLMTimeoutError")})
    status = status_at(sqlite_engine, DUE2 + timedelta(hours=8))
    assert (status.status, status.fresh) == ("succeeded", True), status.reason
    assert status.latest is not None and status.latest.id == tonight


def test_an_empty_database_is_none(sqlite_engine: Engine) -> None:
    status = status_at(sqlite_engine, DUE2)
    assert status.status == "none" and status.latest is None and not status.fresh


def test_a_running_night_shows_progress_with_the_eta_by_work_left(
        sqlite_engine: Engine) -> None:
    add_night(sqlite_engine, D1, DUE1, GOOD)
    now = DUE2 + timedelta(minutes=20)
    running = add_night(sqlite_engine, D2, DUE2,
                        {"AAA": Rated("Buy", 0.7), "BBB": Rated(status="running"),
                         "CCC": Rated(status="queued"), "DDD": Rated(status="queued")},
                        status="running", heartbeat=now - timedelta(seconds=10))
    # AAA answered all 17 nodes long ago, BBB its 4 analysts in the last 2 minutes, each
    # call alone on the server for its 4 s from ready to answer (tests/unit/support/eta_rows.py).
    calls(sqlite_engine, running, "AAA", NODES, end=now - timedelta(minutes=10))
    calls(sqlite_engine, running, "BBB", list(ANALYSTS), end=now - timedelta(seconds=10))
    status = status_at(sqlite_engine, now)
    assert status.status == "running" and not status.fresh
    prog = status.progress
    assert prog is not None
    assert (prog.tickers_done, prog.tickers_running, prog.calls, prog.expected_calls) == \
        (1, 1, 21, 68)
    # Left: BBB's 13 later nodes and CCC's and DDD's 17 each, 47 calls at 4 s each, less
    # what BBB's next call has had of the server since its ready 10 s ago (alone), never
    # more than half its 4 s.
    assert prog.eta_s == 47 * 4 - 2
    assert f"#{running}" in status.headline and "about 3 min 06 s" in status.headline
    assert status.reason is not None and "is still running (1 of 4 tickers done)" in status.reason


def test_a_running_night_without_a_heartbeat_is_crashed(sqlite_engine: Engine) -> None:
    now = DUE2 + timedelta(hours=3)
    add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(status="running")}, status="running",
              heartbeat=now - timedelta(minutes=10))
    status = status_at(sqlite_engine, now)
    assert status.status == "crashed" and "no sign of life since" in status.headline


def test_the_daemon_heartbeat_is_stored_and_judged_current(sqlite_engine: Engine) -> None:
    beat = Heartbeat(sqlite_engine, 30.0, lambda: DUE2, "10 0 * * * (UTC)")
    with time_machine.travel(DUE2 - timedelta(hours=1), tick=False):
        beat.beat()
        beat.beat()  # the same host's row, updated
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(SchedulerBeat)).all()
    assert len(rows) == 1 and rows[0].next_run_at == DUE2
    fresh = status_at(sqlite_engine, DUE2 - timedelta(hours=1) + timedelta(seconds=60))
    old = status_at(sqlite_engine, DUE2 - timedelta(hours=1) + timedelta(seconds=600))
    assert fresh.scheduler is not None and fresh.scheduler.current
    assert old.scheduler is not None and not old.scheduler.current
    assert status_at(sqlite_engine, DUE2).scheduler is not None


def test_the_heartbeat_thread_beats_until_closed(sqlite_engine: Engine) -> None:
    with Heartbeat(sqlite_engine, 0.05, lambda: None, "10 0 * * * (UTC)") as beat:
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while datetime.now(UTC) < deadline:
            with sqlite_engine.connect() as conn:
                if conn.execute(select(SchedulerBeat)).first() is not None:
                    break
    assert not beat._thread.is_alive()


# --- the CLI's face ---

def test_ranking_after_a_failed_night_says_so_first_and_require_fresh_exits_6(
        sqlite_engine: Engine) -> None:
    first = add_night(sqlite_engine, D1, DUE1, GOOD)
    second = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error="boom")},
                       status="failed", error="every ticker failed")
    with time_machine.travel(DUE2 + timedelta(hours=8), tick=False):
        shown = run_cli("ranking", env=UTC_ENV)
        strict = run_cli("ranking", "--require-fresh", "--format", "json", env=UTC_ENV)
    assert shown.code == 0, shown.stderr
    lines = shown.stderr.splitlines()
    assert lines[0].startswith("not the latest night: the latest night, batch "
                               f"#{second} (as of {D2}), failed")
    assert f"this ranking is of {D1} (batch #{first})" in lines[0]
    assert lines[1].startswith(f"night: nightly batch #{second} (as of {D2}) failed")
    assert strict.code == STALE_EXIT
    assert strict.stderr.splitlines()[0].startswith("not the latest night:")
    data = json.loads(strict.stdout)
    assert [r["ticker"] for r in data["rows"]] == ["AAA", "BBB"]
    assert data["batch"]["id"] == first
    assert (data["night"]["status"], data["night"]["fresh"]) == ("failed", False)
    assert data["night"]["latest"]["id"] == second


def test_ranking_after_a_missed_night_says_stale(sqlite_engine: Engine) -> None:
    add_night(sqlite_engine, D1, DUE1, GOOD)
    with time_machine.travel(DUE2 + timedelta(hours=8), tick=False):
        strict = run_cli("ranking", "--require-fresh", env=UTC_ENV)
    assert strict.code == STALE_EXIT
    assert strict.stderr.splitlines()[0].startswith(
        "not the latest night: stale: no nightly batch since the night due 2026-11-28")


def test_ranking_of_a_fresh_night_exits_0_with_require_fresh(sqlite_engine: Engine) -> None:
    first = add_night(sqlite_engine, D1, DUE1, GOOD)
    with time_machine.travel(DUE1 + timedelta(hours=8), tick=False):
        strict = run_cli("ranking", "--require-fresh", env=UTC_ENV)
    assert strict.code == 0, strict.stderr
    assert strict.stderr.splitlines()[0].startswith(f"night: nightly batch #{first}")


def test_ranking_with_no_finished_night_names_the_failed_one(sqlite_engine: Engine) -> None:
    only = add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error="boom")}, status="failed",
                     error="every ticker failed")
    with time_machine.travel(DUE2 + timedelta(hours=8), tick=False):
        result = run_cli("ranking", env=UTC_ENV)
    assert result.code == 2
    assert len(result.error_lines) == 1
    assert f"batch #{only}" in result.stderr and "failed" in result.stderr


@pytest.mark.parametrize("nights", ["none at all", "only a failed one"])
def test_require_fresh_with_no_finished_night_exits_6(sqlite_engine: Engine,
                                                      nights: str) -> None:
    # No ranking to show is "not fresh" for a script (6), not bad input (2).
    if nights == "only a failed one":
        add_night(sqlite_engine, D2, DUE2, {"AAA": Rated(error="boom")}, status="failed",
                  error="every ticker failed")
    with time_machine.travel(DUE2 + timedelta(hours=8), tick=False):
        table = run_cli("ranking", "--require-fresh", env=UTC_ENV)
        as_json = run_cli("ranking", "--require-fresh", "--format", "json", env=UTC_ENV)
    assert table.code == STALE_EXIT and as_json.code == STALE_EXIT, table.stderr
    assert table.stdout == "" and "Traceback" not in table.stderr
    assert table.stderr.splitlines()[0].startswith(
        "not the latest night: " if nights == "only a failed one" else "no night yet: ")
    assert ("no finished night to rank" if nights == "only a failed one"
            else "no night has run yet") in table.stderr.splitlines()[0]
    data = json.loads(as_json.stdout)
    assert data["batch"] is None and data["rows"] == []
    assert data["night"]["fresh"] is False
    assert data["night"]["status"] == ("failed" if nights == "only a failed one" else "none")


def test_require_fresh_with_an_unknown_batch_is_bad_input(sqlite_engine: Engine) -> None:
    add_night(sqlite_engine, D1, DUE1, GOOD)
    result = run_cli("ranking", "--batch", "999", "--require-fresh", env=UTC_ENV)
    assert result.code == 2 and result.error_lines == ["error: no batch with id 999"]


def test_a_night_running_through_the_next_due_time_reads_running_not_stale(
        sqlite_engine: Engine) -> None:
    # A night begun before the due time it runs through (started by hand that evening, or the
    # night before's gone long) is the night at work, not a missed one.
    add_night(sqlite_engine, D1, DUE1, GOOD)
    now = DUE2 + timedelta(hours=1)
    night = add_night(sqlite_engine, D2, DUE2 - timedelta(hours=2),
                      {"AAA": Rated(status="running")}, status="running",
                      heartbeat=now - timedelta(seconds=10))
    status = status_at(sqlite_engine, now)
    assert status.status == "running" and status.latest is not None
    assert status.latest.id == night
    assert status.reason is not None and "is still running" in status.reason, status.reason
