"""Check the scheduler daemon on a controlled clock: the real APScheduler, its job store, its loop.

Each test starts the daemon's own BlockingScheduler (stores, executor, job) without its
endless wait, then runs the scheduler's loop body (``_process_jobs``) at frozen instants:
exactly what the daemon does when it wakes, minus the sleeping in between.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import structlog
import time_machine
from alembic import command
from apscheduler.schedulers.base import STATE_STOPPED
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy import Engine, inspect, select

from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.config import load_settings
from app.db.batchsettings import BatchSettings
from app.db.engine import alembic_config, make_engine
from app.db.models import Batch, SchedulerBeat
from app.morning.nightstatus import night_status
from app.runs.daemon import JOB_ID, JOBS_TABLE, NightlyDaemon, NightlyTrigger
from tests.fakevllm import ChatRequest, Reply
from tests.unit.support.daemon_clock import (
    BERLIN,
    NIGHT,
    Recorder,
    batch_settings,
    daemon_for,
    local,
    running,
    tick,
)
from tests.unit.support.engines import fake_llm
from tests.unit.support.sigterm import sigterm_at_first

NIGHTDESK = Path(sys.executable).with_name("nightdesk")
# The daemon's nights take the demo snapshot's whole list: two tickers.
pytestmark = pytest.mark.demo_tickers(2)


def test_the_trigger_is_the_nightly_one() -> None:
    # from_crontab builds the subclass, so the dedup below is what the daemon really uses.
    daemon = NightlyDaemon(load_settings(schedule_timezone="Europe/Berlin"), make_engine("sqlite://"))
    assert type(daemon.trigger) is NightlyTrigger
    assert str(daemon.trigger.timezone) == "Europe/Berlin"


def test_fires_once_at_the_scheduled_time_and_logs_the_next(sqlite_engine: Engine) -> None:
    recorder = Recorder()
    with structlog.testing.capture_logs() as logs, \
            running(daemon_for(sqlite_engine, recorder), NIGHT - timedelta(hours=3)) as daemon:
        assert daemon.next_run_time() == NIGHT
        for moment in (NIGHT - timedelta(seconds=1), NIGHT, NIGHT + timedelta(seconds=30),
                       NIGHT + timedelta(hours=5), NIGHT + timedelta(hours=23, minutes=59)):
            tick(daemon, moment)
        assert recorder.fired == [NIGHT]
        assert recorder.ran_at == [NIGHT]  # at 00:10 sharp, not a tick later
        tomorrow = local(date(2026, 11, 29), 0, 10)
        assert daemon.next_run_time() == tomorrow
        tick(daemon, tomorrow)
        assert recorder.fired == [NIGHT, tomorrow]
    nexts = [e["next_run"] for e in logs if e["event"] == "next nightly run"]
    assert nexts == [tomorrow.isoformat(), local(date(2026, 11, 30), 0, 10).isoformat()]


@pytest.mark.parametrize(("back_at", "expected"), [
    # Off at 00:10, back at 03:00: within the 6 h grace, the night runs once.
    (local(date(2026, 11, 28), 3, 0), [NIGHT]),
    # Off for three nights: they fold into one run, for the latest.
    (local(date(2026, 12, 1), 2, 0), [local(date(2026, 12, 1), 0, 10)]),
    # Back 6 h 1 min late: too late to start a night; tomorrow's stands.
    (local(date(2026, 11, 28), 6, 11), []),
], ids=["within-grace", "three-nights-missed", "past-grace"])
def test_a_host_that_was_off_catches_up_at_most_once(sqlite_engine: Engine, back_at: datetime,
                                                      expected: list[datetime]) -> None:
    recorder = Recorder()
    with running(daemon_for(sqlite_engine, recorder), local(date(2026, 11, 27), 20, 0)):
        pass  # the job is stored for 00:10; then the host goes down
    with running(daemon_for(sqlite_engine, recorder), back_at) as daemon:
        assert daemon.next_run_time() == NIGHT  # the store remembered the missed night
        for later in (back_at, back_at + timedelta(minutes=1), back_at + timedelta(hours=1)):
            tick(daemon, later)
        assert recorder.fired == expected
        assert daemon.next_run_time() == local(back_at.date() + timedelta(days=1), 0, 10)


def test_a_night_missed_past_the_grace_is_no_silent_night(
        sqlite_engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    from tests.webhook import webhook

    recorder = Recorder()
    with running(daemon_for(sqlite_engine, recorder), local(date(2026, 11, 27), 20, 0)):
        pass  # the job is stored for 00:10; then the host goes down until 06:11
    with webhook() as hook, \
            running(daemon_for(sqlite_engine, recorder, notify=hook.url()),
                    local(date(2026, 11, 28), 6, 11)) as daemon:
        tick(daemon, local(date(2026, 11, 28), 6, 11))
    assert recorder.fired == []
    # Not only a journal line: the morning's digest says the night did not run, and why.
    [post] = hook.posts
    assert post["type"] == "failure"
    assert post["title"] == "nightdesk: the night due 2026-11-27 23:10 UTC MISSED, no batch run"
    assert ("Why: the scheduler daemon reached it at 2026-11-28 05:11 UTC, 6 h 01 min after "
            "it was due: past NIGHTDESK_SCHEDULE_MISFIRE_GRACE_S (6 h 00 min)") \
        in post["message"].splitlines(), post["message"]
    assert "`nightdesk run --continue-night`" in post["message"], post["message"]
    # Said once, in nightdesk's words: not again by APScheduler's own warning.
    assert [r.getMessage() for r in caplog.records if r.name.startswith("apscheduler")
            and r.levelno >= logging.WARNING] == []


def test_only_apschedulers_missed_warning_is_dropped_its_executors_others_come_out(
        sqlite_engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    daemon_for(sqlite_engine, Recorder())  # sets up what silences the second word of a miss
    executor = logging.getLogger("apscheduler.executors.default")  # APScheduler 3.11's run_job
    with caplog.at_level(logging.WARNING):
        executor.warning('Run time of job "%s" was missed by %s', "nightly",
                         timedelta(hours=6, minutes=1))
        executor.warning('Job "%s" ran %s late', "nightly", "a while")  # any other warning
        executor.error("Error running job %s", "nightly")
    assert [r.getMessage() for r in caplog.records if r.name == executor.name] == [
        'Job "nightly" ran a while late', "Error running job nightly"]


def test_the_job_table_is_apschedulers_and_alembic_leaves_it_alone(sqlite_engine: Engine,
                                                                   sqlite_url: str) -> None:
    with running(daemon_for(sqlite_engine, Recorder()), NIGHT - timedelta(hours=1)):
        pass
    assert JOBS_TABLE in inspect(sqlite_engine).get_table_names()
    # `alembic check` through our env.py: the models and migrations agree, and the job
    # store's table is not reported as something to drop.
    with sqlite_engine.connect() as conn:
        cfg = alembic_config(sqlite_url)
        cfg.attributes["connection"] = conn
        command.check(cfg)


def test_replace_existing_alone_would_drop_the_missed_night(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Why schedule() carries the stored next run time over: without it, add_job with
    # replace_existing=True recomputes it from "now" and the missed night is gone.
    recorder = Recorder()
    with running(daemon_for(sqlite_engine, recorder), local(date(2026, 11, 27), 20, 0)):
        pass
    monkeypatch.setattr(NightlyDaemon, "_stored_next_run", lambda self: None)
    with running(daemon_for(sqlite_engine, recorder), local(date(2026, 11, 28), 3, 0)) as daemon:
        tick(daemon, local(date(2026, 11, 28), 3, 0))
        assert recorder.fired == []
        assert daemon.next_run_time() == local(date(2026, 11, 29), 0, 10)


def test_a_changed_schedule_is_taken_as_new(sqlite_engine: Engine) -> None:
    recorder = Recorder()
    with running(daemon_for(sqlite_engine, recorder), local(date(2026, 11, 27), 20, 0)):
        pass
    with running(daemon_for(sqlite_engine, recorder, schedule_cron="45 1 * * *"),
                 local(date(2026, 11, 28), 1, 0)) as daemon:
        assert daemon.next_run_time() == local(date(2026, 11, 28), 1, 45)
        assert len(daemon.scheduler.get_jobs()) == 1 and daemon.scheduler.get_job(JOB_ID)


@pytest.mark.slow
@pytest.mark.parametrize(("zone", "cron", "first_night"), [
    ("Europe/Berlin", "30 2 * * *", date(2026, 10, 24)),    # 02:30 comes twice on 10-25
    ("Europe/Berlin", "30 2 * * *", date(2026, 3, 28)),     # 02:30 does not exist on 03-29
    ("America/New_York", "30 1 * * *", date(2026, 10, 31)),  # 01:30 comes twice on 11-01
    ("America/New_York", "30 2 * * *", date(2026, 3, 7)),    # 02:30 does not exist on 03-08
], ids=["berlin-autumn", "berlin-spring", "new-york-autumn", "new-york-spring"])
def test_once_per_night_across_a_dst_change(sqlite_engine: Engine, zone: str, cron: str,
                                            first_night: date) -> None:
    tz = ZoneInfo(zone)
    recorder = Recorder()
    start = local(first_night - timedelta(days=1), 12, 0, tz)
    daemon = daemon_for(sqlite_engine, recorder, schedule_timezone=zone, schedule_cron=cron)
    with running(daemon, start):
        # Wake every 5 minutes of real (UTC) time for three days: every instant of both
        # passes through a repeated hour, and the first instant after a skipped one.
        moment = start.astimezone(UTC)
        for _ in range(3 * 24 * 12):
            tick(daemon, moment)
            moment += timedelta(minutes=5)
    nights = [first_night + timedelta(days=i) for i in range(3)]
    assert [t.astimezone(tz).date() for t in recorder.ran_at] == nights
    # Each ran on its tick (nothing late), and the DST night at the same wall time or, when
    # that time does not exist, at the first instant after the gap (one hour later).
    for fired, ran in zip(recorder.fired, recorder.ran_at, strict=True):
        assert timedelta(0) <= ran - fired < timedelta(minutes=5)
    hour, minute = int(cron.split()[1]), int(cron.split()[0])
    walls = [(t.astimezone(tz).hour, t.astimezone(tz).minute) for t in recorder.ran_at]
    assert walls[0] == walls[2] == (hour, minute)
    assert walls[1] in ((hour, minute), (hour + 1, minute))


def test_plain_cron_trigger_fires_twice_in_the_repeated_hour() -> None:
    # The reason for NightlyTrigger: APScheduler's CronTrigger follows the wall clock.
    def fires(trigger: CronTrigger) -> list[datetime]:
        out: list[datetime] = []
        now = local(date(2026, 10, 24), 12, 0)
        previous = None
        while (following := trigger.get_next_fire_time(previous, now)) < local(
                date(2026, 10, 26), 12, 0):
            out.append(following)
            previous = now = following
        return out

    plain = fires(CronTrigger.from_crontab("30 2 * * *", timezone=BERLIN))
    ours = fires(NightlyTrigger.from_crontab("30 2 * * *", timezone=BERLIN))
    assert [t.astimezone(UTC).hour for t in plain] == [0, 1, 1]  # 10-25 CEST, 10-25 CET, 10-26
    assert [t.astimezone(UTC) for t in ours] == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
                                                 datetime(2026, 10, 26, 1, 30, tzinfo=UTC)]


def test_a_second_daemon_does_not_double_run(sqlite_engine: Engine, sqlite_url: str,
                                             demo_dir: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from app.runs.nightly import run_nightly

    other_engine = make_engine(sqlite_url)  # the other daemon's own connections
    first = daemon_for(sqlite_engine, run_nightly, **batch_settings(demo_dir))
    second = daemon_for(other_engine, run_nightly, **batch_settings(demo_dir))
    seen_by_second: list[str] = []

    def script(chat: ChatRequest) -> Reply | None:
        if not seen_by_second:
            # The first daemon's batch is under way: the second wakes at the same 00:10.
            seen_by_second.append("woke")
            worker = threading.Thread(target=second.scheduler._process_jobs)
            worker.start()
            worker.join(60)
        return None

    server = fake_llm(monkeypatch, script, demo_tickers(2))
    with structlog.testing.capture_logs() as logs, \
            running(first, NIGHT - timedelta(hours=1)), running(second, NIGHT - timedelta(hours=1)):
        tick(first, NIGHT)
        assert first.next_run_time() == second.next_run_time() == NIGHT + timedelta(days=1)
    with sqlite_engine.connect() as conn:
        batches = conn.execute(select(Batch.id, Batch.kind, Batch.status)).all()
    assert [(kind, status) for _, kind, status in batches] == [("nightly", "succeeded")]
    skipped = [e for e in logs if e["event"] == "nightly run skipped"]
    assert [e["reason"] for e in skipped] == [f"already running: batch {batches[0].id}"]
    assert len(server.chats) == 17 * 2  # one batch's calls, none from the second daemon


@pytest.mark.parametrize(("done_at", "repeat", "runs_again", "told"), [
    # The batch finished, then the process died before the schedule moved on: the next
    # start finds tonight still due, and tonight's batch finished since it fired.
    (NIGHT + timedelta(minutes=1), False, False, False),
    # A batch of the same date finished before tonight's fire (no newer snapshot since):
    # not run a second time, and the digest says why and what to do.
    (NIGHT - timedelta(minutes=30), False, False, True),
    # Unless asked: NIGHTDESK_SCHEDULE_REPEAT_AS_OF=true runs the date again.
    (NIGHT - timedelta(minutes=30), True, True, False),
], ids=["done-since-the-fire", "done-before-it", "done-before-it-repeat-asked"])
def test_a_night_already_done_is_not_run_again(sqlite_engine: Engine, demo_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               done_at: datetime, repeat: bool,
                                               runs_again: bool, told: bool) -> None:
    from app.batch import store
    from app.runs.nightly import run_nightly
    from tests.webhook import webhook

    server = fake_llm(monkeypatch, None, demo_tickers(2))
    with running(daemon_for(sqlite_engine, run_nightly, **batch_settings(demo_dir)),
                 NIGHT - timedelta(hours=1)):
        pass
    with time_machine.travel(done_at, tick=False):
        done = store.create_batch(sqlite_engine, kind="nightly", as_of=DEMO_AS_OF,
                                  tickers=demo_tickers(2), samples=1, settings=BatchSettings(),
                                  server_facts=None)
        for ticker in demo_tickers(2):  # a batch succeeds when every ticker has
            store.ticker_finished(sqlite_engine, done, ticker, [store.DecisionRow(
                ticker, 0, "Hold", 0.0, 0.5, "stored")], None)
        store.finish_batch(sqlite_engine, done, "succeeded")
    with webhook() as hook, structlog.testing.capture_logs() as logs, \
            running(daemon_for(sqlite_engine, run_nightly, notify=hook.url(),
                               schedule_repeat_as_of=repeat, **batch_settings(demo_dir)),
                    NIGHT + timedelta(hours=2)) as daemon:
        assert daemon.next_run_time() == NIGHT
        tick(daemon, NIGHT + timedelta(hours=2))
        assert daemon.next_run_time() == NIGHT + timedelta(days=1)
        # The next night's fire finds the same date analyzed (no newer snapshot): told once.
        if told:
            tick(daemon, NIGHT + timedelta(days=1, minutes=1))
            morning = night_status(sqlite_engine, daemon.settings, done,
                                   now=NIGHT + timedelta(days=1, hours=2))
    skipped = [e["batch_id"] for e in logs if e["event"] == "night already done"]
    covered = [e for e in logs if e["event"] == "nightly run skipped: its as-of date has a "
                                                "nightly batch"]
    with sqlite_engine.connect() as conn:
        batches = conn.execute(select(Batch.id)).scalars().all()
    if runs_again:
        assert skipped == [] and len(batches) == 2 and len(server.chats) == 17 * 2
        assert [p["type"] for p in hook.posts] == ["success"]  # the night's own digest
    else:
        assert batches == [done] and server.chats == []
        assert skipped == ([] if told else [done])
    if told:
        assert {(e["batch_id"], e["log_level"]) for e in covered} == {(done, "warning")}
        [post] = hook.posts  # one for both fires: the stored row records the telling
        # That row's time is the newest fire's: the stale morning still names it.
        assert morning.status == "stale" and morning.refused is not None
        assert f"already analyzed by nightly batch #{done}" in morning.refused.title
        assert len(covered) == 2
        # The demo snapshot's night: labelled as every face of a demo night is.
        assert post["title"] == (f"DEMO DATA — nightdesk: night of {DEMO_AS_OF} already "
                                 f"analyzed by nightly batch #{done}, nothing run")
        assert post["type"] == "info"  # nothing was refused
        # Its journal line names it as it is (it said "refusal digest sent").
        assert [(e["outcome"], e["news"]) for e in logs if e["event"] == "digest sent"] == [
            ("nothing run", "info")]
        assert not [e for e in logs if "refus" in e["event"]]
        assert (f"Why: nightly batch #{done} has already analyzed as-of {DEMO_AS_OF}"
                in post["message"])
        assert f"`nightdesk run --as-of {DEMO_AS_OF}`" in post["message"]
        assert "NIGHTDESK_SCHEDULE_REPEAT_AS_OF=true" in post["message"]
    elif not runs_again:
        assert hook.posts == [] and covered == []


@pytest.fixture
def restore_signals() -> Iterator[None]:
    yield
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.mark.slow
def test_sigterm_mid_batch_leaves_the_night_due_and_the_next_start_takes_it_up(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch,
        restore_signals: None) -> None:
    from app.runs.nightly import run_nightly

    script = sigterm_at_first("bull_r1", lambda chat: Reply("late", delay_s=5))
    server = fake_llm(monkeypatch, script, demo_tickers(2))
    daemon = daemon_for(sqlite_engine, run_nightly, **batch_settings(demo_dir))
    with running(daemon, NIGHT - timedelta(hours=1)):
        daemon.install_signal_handlers()
        tick(daemon, NIGHT)
        deadline = time.monotonic() + 10
        while daemon.scheduler.state != STATE_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon.scheduler.state == STATE_STOPPED  # the daemon stopped itself
    assert signal.getsignal(signal.SIGTERM) == daemon._on_signal  # never left at SIG_DFL
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalars().all() == ["interrupted"]
    answered = {(c.ticker, c.node) for c in server.served()}
    # The call at the server when the signal came finished within the grace, and was kept.
    assert any(node == "bull_r1" for _, node in answered)

    # Started again ten minutes later: the night is still due, and the interrupted batch is
    # what it takes up (resumed by node, not run a second time beside it).
    before = len(server.chats)
    restarted = daemon_for(sqlite_engine, run_nightly, **batch_settings(demo_dir))
    with structlog.testing.capture_logs() as logs, \
            running(restarted, NIGHT + timedelta(minutes=10)) as again:
        assert again.next_run_time() == NIGHT
        tick(again, NIGHT + timedelta(minutes=10))
        assert again.next_run_time() == NIGHT + timedelta(days=1)  # the night is done
    resuming = [e for e in logs if e["event"] == "resuming the night"]
    assert len(resuming) == 1 and resuming[0]["status"] == "interrupted"
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalars().all() == ["succeeded"]
    # No node answered before the stop was asked again; together, every node once.
    again_asked = [(c.ticker, c.node) for c in server.chats[before:]]
    assert not answered & set(again_asked)
    assert len(answered) + len(again_asked) == 17 * 2


def test_the_nightly_job_resumes_tonights_dead_batch_instead_of_starting_another(
        sqlite_engine: Engine, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.runs.nightly import run_nightly
    from tests.unit.support.night_rows import dead_night

    done, left = demo_tickers(2)
    dead = dead_night(sqlite_engine, done, left)
    server = fake_llm(monkeypatch, None, [done, left])
    with structlog.testing.capture_logs() as logs, \
            running(daemon_for(sqlite_engine, run_nightly, **batch_settings(demo_dir)),
                    NIGHT - timedelta(minutes=5)) as daemon:
        tick(daemon, NIGHT)
    resuming = [e for e in logs if e["event"] == "resuming the night"]
    assert [(e["batch_id"], e["status"]) for e in resuming] == [(dead, "crashed")]
    with sqlite_engine.connect() as conn:
        batches = conn.execute(select(Batch.id, Batch.status)).all()
    assert [tuple(b) for b in batches] == [(dead, "succeeded")]  # no second batch
    # Only the ticker left was run; the stored one was not asked again.
    assert {c.ticker for c in server.chats} == {left} and len(server.chats) == 17


def _heartbeat(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(SchedulerBeat)).first()


@pytest.mark.slow
def test_the_daemon_process_logs_its_next_run_and_stops_on_sigterm(tmp_path: Path) -> None:
    zone = ZoneInfo("Asia/Tokyo")  # no DST: the next 00:10 is plain arithmetic
    env = {**os.environ, "NIGHTDESK_DATABASE_URL": f"sqlite:///{tmp_path}/nd.db",
           "NIGHTDESK_SCHEDULE_TIMEZONE": "Asia/Tokyo", "NIGHTDESK_LOG_FORMAT": "json"}
    daemon = subprocess.Popen([str(NIGHTDESK), "scheduler"], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert daemon.stderr is not None
        events = []
        for line in daemon.stderr:
            events.append(json.loads(line))
            if events[-1]["event"] == "scheduler started":
                break
        now = datetime.now(zone)
        expected = now.replace(hour=0, minute=10, second=0, microsecond=0)
        if expected <= now:
            expected += timedelta(days=1)
        starting = next(e for e in events if e["event"] == "scheduler starting")
        assert (starting["timezone"], starting["timezone_source"]) == ("Asia/Tokyo", "setting")
        assert datetime.fromisoformat(events[-1]["next_run"]) == expected
        # Its heartbeat is in the database, with the same next run, for the morning page.
        engine = make_engine(f"sqlite:///{tmp_path}/nd.db")
        deadline = time.monotonic() + 20
        # The first row may be written before the scheduler knows its next run; the beat after
        # its start carries it.
        while (beat := _heartbeat(engine)) is None or beat.next_run_at is None:
            assert time.monotonic() < deadline, "no heartbeat row with the next run"
            time.sleep(0.1)
        assert beat.pid == daemon.pid and beat.next_run_at == expected
        # At once, while it may still be writing that line: the stop must not be lost.
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=20) == 0
        rest = [json.loads(line) for line in daemon.stderr.read().splitlines()]
        assert rest[-1]["event"] == "scheduler stopped" and rest[-1]["on_request"] is True
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
