"""No silent night: a night refused at its start pushes a digest naming why and what to do.

Both paths are driven: ``nightdesk run --continue-night`` (what the timer's unit runs) and the
scheduler daemon's fire, which runs the same preflight (the model at ``/v1/models``
included). The digest travels the real way (Apprise, HTTP, tests/webhook.py); the vLLM
server is a fake at the HTTP edge.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from app.db.batchsettings import BatchSettings
from app.db.models import Batch, NightRefusal, TickerRun
from tests.fakevllm import FakeServer
from tests.unit.support.clirun import run_cli
from tests.unit.support.engines import batch_count, fake_llm
from tests.webhook import Webhook, closed_port, webhook

ADVICE = "What to do: fix that, then start the night again: nightdesk run --continue-night"
# The database is what refused the night: the advice names it, and the refusal is not stored.
DB_ADVICE = ("What to do: make the database reachable and writable (its server up, its disk "
             "not full, NIGHTDESK_DATABASE_URL right), then start the night again: nightdesk "
             "run --continue-night")
NOT_SHOWN = "does not show this refusal: the database did not store it"
CAUSES = ["server-down", "no-snapshot", "wrong-model"]


@pytest.fixture
def hook() -> Iterator[Webhook]:
    with webhook() as listening:
        yield listening


def cause(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, str],
                                                                                 str]:
    """Set up one way a night is refused; return the settings it needs and what it says."""
    if name != "no-snapshot":
        write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    if name == "server-down":
        return ({"NIGHTDESK_LLM_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1"},
                "cannot reach")
    if name == "database-away":
        return ({"NIGHTDESK_DATABASE_URL":
                 f"postgresql://postgres@127.0.0.1:{closed_port()}/nightdesk"},
                "cannot reach database postgresql://postgres@127.0.0.1:")  # as configured
    if name == "wrong-model":
        server = FakeServer(model="qwen-dense-27b")
        monkeypatch.setattr("serving.preflight.httpx.Client", lambda **_: server.sync_client())
        return {}, "does not serve 'smollm2-135m' (it serves: qwen-dense-27b)"
    return {}, "no snapshot under"


def assert_told(hook: Webhook, says: str, database: bool = False,
                command: str = "nightdesk run --continue-night") -> None:
    """``command``: the command that was refused, which the advice names again."""
    [post] = hook.posts
    assert post["type"] == "failure"
    assert "REFUSED at its start, no batch run" in post["title"]
    lines = post["message"].splitlines()
    assert lines[0].startswith("Why: ") and says in lines[0], lines
    advice = DB_ADVICE if database else ADVICE
    assert lines[1] == advice.replace("nightdesk run --continue-night", command)
    assert lines[2].startswith("Page: ") and (NOT_SHOWN in lines[2]) == database, lines


@pytest.mark.parametrize("name", [*CAUSES, "database-away"])
def test_the_timers_refused_night_pushes_a_digest(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hook: Webhook,
        name: str) -> None:
    env, says = cause(name, tmp_path, monkeypatch)
    result = run_cli("run", "--continue-night",
                     env={**env, "NIGHTDESK_NOTIFY": hook.url(),
                          "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 2, result.stderr
    [error] = [line for line in result.error_lines if line.startswith("error: ")]
    assert says in error and "Traceback" not in result.stderr, result.stderr
    if name != "database-away":
        assert batch_count(sqlite_engine) == 0
    assert_told(hook, says, database=name == "database-away")


@pytest.mark.parametrize("name", CAUSES)
def test_the_daemons_refused_night_pushes_a_digest(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hook: Webhook,
        name: str) -> None:
    from app.runs.nightly import run_nightly
    from tests.unit.support.daemon_clock import NIGHT, daemon_for, running, tick

    env, says = cause(name, tmp_path, monkeypatch)
    overrides: dict[str, Any] = {key.removeprefix("NIGHTDESK_").lower(): value
                                 for key, value in env.items()}
    with structlog.testing.capture_logs() as logs, \
            running(daemon_for(sqlite_engine, run_nightly, notify=hook.url(),
                               check_context_length=False, **overrides),
                    NIGHT - timedelta(minutes=5)) as daemon:
        tick(daemon, NIGHT)
    failed = [e for e in logs if e["event"] == "nightly run failed"]
    assert len(failed) == 1 and says in failed[0]["error"], logs
    assert batch_count(sqlite_engine) == 0
    assert_told(hook, says)


def test_a_fire_whose_database_is_away_pushes_a_digest(hook: Webhook) -> None:
    # The daemon's engine outlives a database that went away: the fire's first connection
    # is refused (not a busy server: said at once, before the lock), and the digest says so.
    from app.config import load_settings
    from app.db.engine import make_engine
    from app.errors import DatabaseError
    from app.runs.nightly import run_nightly

    settings = load_settings(notify=hook.url(), database_url=f"postgresql://postgres@"
                             f"127.0.0.1:{closed_port()}/nightdesk")
    with pytest.raises(DatabaseError, match="cannot reach database"):
        run_nightly(settings, engine=make_engine(settings.store.database_url), resume=True,
                    server="require")
    assert_told(hook, "cannot reach database", database=True)


@pytest.mark.parametrize("command", [["run", "--continue-night"], ["run"]])
def test_a_night_whose_first_write_the_database_refuses_is_one_line_and_a_digest(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hook: Webhook,
        command: list[str]) -> None:
    # A full disk past the preflight: SQLite opens the file read-only, the batch's first
    # write is refused. Before, a traceback and no digest; the refusal cannot be stored.
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from app.batch import store

    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    fake_llm(monkeypatch, None, demo_tickers(2))

    def full(*_: object, **__: object) -> int:
        raise OperationalError("INSERT INTO batches", {}, sqlite3.OperationalError(
            "attempt to write a readonly database"))

    monkeypatch.setattr(store, "create_batch", full)
    monkeypatch.setattr("app.runs.preflight.NightRefusal", None)  # its row cannot be stored
    result = run_cli(*command, env={"NIGHTDESK_NOTIFY": hook.url(),
                                    "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    says = ("the batch could not start: its rows not stored: attempt to write a readonly "
            "database")
    assert (result.code, result.error_lines[-1:]) == (2, [f"error: {says}"]), result.stderr
    assert "Traceback" not in result.stderr and batch_count(sqlite_engine) == 0
    assert_told(hook, says, database=True, command=" ".join(["nightdesk", *command]))


def test_the_advised_command_starts_the_night_once_the_cause_is_fixed(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        hook: Webhook) -> None:
    env, _ = cause("server-down", tmp_path, monkeypatch)
    assert run_cli("run", "--continue-night", env=env).code == 2
    fake_llm(monkeypatch, None, demo_tickers(2))  # the server is back, serving the model
    command = ADVICE.rsplit(": ", 1)[1].split()
    assert command[0] == "nightdesk"
    result = run_cli(*command[1:], env={"NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 0, result.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.kind, Batch.status)).all() == [("nightly", "succeeded")]


def test_a_night_another_run_holds_is_no_refusal(
        sqlite_engine: Engine, tmp_path: Path, hook: Webhook) -> None:
    from app.db.lock import nightly_lock

    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    with nightly_lock(sqlite_engine):
        result = run_cli("run", "--continue-night", env={"NIGHTDESK_NOTIFY": hook.url()})
    assert result.code == 4, result.stderr
    assert hook.posts == []


def test_the_advice_for_a_date_already_analyzed_works(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.batch import store
    from app.config import load_settings
    from app.runs.nightly import run_nightly

    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    done = store.create_batch(sqlite_engine, kind="nightly", as_of=DEMO_AS_OF,
                              tickers=demo_tickers(2), samples=1, settings=BatchSettings(),
                              server_facts=None)
    store.finish_batch(sqlite_engine, done, "succeeded")
    told: list[str] = []
    monkeypatch.setattr("app.runs.preflight.send_refusal",
                        lambda _settings, _as_of, why, advice, *_, **__: told.append(advice))
    night = run_nightly(load_settings(), engine=sqlite_engine, resume=True,
                        once_per_as_of=True, server="skip")
    assert night.outcome is None and night.covered_by == done
    [advice] = told
    command = advice.split("`")[3].split()  # `nightdesk data freeze --help`, then the run
    assert command == ["nightdesk", "run", "--as-of", str(DEMO_AS_OF)]
    assert run_cli("data", "freeze", "--help").code == 0
    fake_llm(monkeypatch, None, demo_tickers(2))
    result = run_cli(*command[1:], env={"NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 0, result.stderr
    assert batch_count(sqlite_engine) == 2


@pytest.mark.parametrize("repeat", [False, True], ids=["once", "repeat-as-of"])
def test_the_timer_does_not_run_a_date_already_analyzed_again(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hook: Webhook,
        repeat: bool) -> None:
    from app.batch import store

    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    done = store.create_batch(sqlite_engine, kind="nightly", as_of=DEMO_AS_OF,
                              tickers=demo_tickers(2), samples=1, settings=BatchSettings(),
                              server_facts=None)
    store.finish_batch(sqlite_engine, done, "succeeded")
    fake_llm(monkeypatch, None, demo_tickers(2))
    result = run_cli("run", "--continue-night",
                     env={"NIGHTDESK_NOTIFY": hook.url(), "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false",
                          "NIGHTDESK_SCHEDULE_REPEAT_AS_OF": str(repeat).lower()})
    assert result.code == 0, result.stderr
    if repeat:  # asked for: the date is analyzed again
        assert batch_count(sqlite_engine) == 2
        return
    assert batch_count(sqlite_engine) == 1
    [post] = hook.posts
    assert f"nightly batch #{done} has already analyzed as-of {DEMO_AS_OF}" in post["message"]
    # Nothing was refused: the title says what it is, and it is news, not a failure.
    title = f"night of {DEMO_AS_OF} already analyzed by nightly batch #{done}, nothing run"
    assert post["title"] == f"DEMO DATA — nightdesk: {title}"
    assert post["type"] == "info"
    # The timer fires again on the same snapshot: said on the command line, pushed once
    # (the stored row is the record of having told it; its time is the newest fire's).
    with sqlite_engine.connect() as conn:
        first = conn.execute(select(NightRefusal.refused_at)).scalar_one()
    again = run_cli("run", "--continue-night",
                    env={"NIGHTDESK_NOTIFY": hook.url(),
                         "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert again.code == 0, again.stderr
    assert any("already analyzed" in line for line in again.error_lines), again.stderr
    assert len(hook.posts) == 1
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(NightRefusal.title, NightRefusal.refused_at)).all()
    assert [row.title for row in rows] == [f"DEMO DATA — {title}"]
    assert rows[0].refused_at >= first


def test_a_date_already_analyzed_is_said_with_a_command_that_takes_its_own_tickers(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        hook: Webhook) -> None:
    from app.batch import store

    write_demo(tmp_path / "data", DEMO_AS_OF, 4)
    mine = demo_tickers(4)[1::2]  # the timer's unit names two of the four
    done = store.create_batch(sqlite_engine, kind="nightly", as_of=DEMO_AS_OF, tickers=mine,
                              samples=1, settings=BatchSettings(), server_facts=None)
    store.finish_batch(sqlite_engine, done, "succeeded")
    fake_llm(monkeypatch, None, mine)
    env = {"NIGHTDESK_NOTIFY": hook.url(), "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"}
    result = run_cli("run", "--continue-night", "--tickers", ",".join(mine), env=env)
    assert result.code == 0, result.stderr
    # Said on the command line too, not only in the digest; both name the same command.
    [line] = [said for said in result.error_lines if "already analyzed" in said]
    advised = f"nightdesk run --as-of {DEMO_AS_OF} --tickers {','.join(mine)}"
    assert line.endswith(f"analyze {DEMO_AS_OF} again now: `{advised}` "
                         "(NIGHTDESK_SCHEDULE_REPEAT_AS_OF=true lets the scheduler do so at "
                         "each fire)"), line
    [post] = hook.posts
    assert f"`{advised}`" in post["message"], post["message"]
    # As given, it analyzes the date again, on the night's own tickers.
    again = run_cli(*shlex.split(advised)[1:], env=env)
    assert again.code == 0, again.stderr
    with sqlite_engine.connect() as conn:
        assert sorted(conn.execute(select(TickerRun.ticker).where(
            TickerRun.batch_id == done + 1)).scalars()) == sorted(mine)


@pytest.mark.parametrize(("start", "again"), [
    (["--as-of", str(DEMO_AS_OF)], f"nightdesk run --as-of {DEMO_AS_OF}"),
    # Its own tickers: the command line as the operator gave it.
    (["--tickers", "{first}"], "nightdesk run --tickers {first}"),
], ids=["as-of", "tickers"])
def test_the_advice_starts_the_same_night_again(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hook: Webhook,
        start: list[str], again: str) -> None:
    env, _ = cause("server-down", tmp_path, monkeypatch)
    first = demo_tickers(2)[0]
    argv = ["run", *(word.format(first=first) for word in start)]
    assert run_cli(*argv, env={**env, "NIGHTDESK_NOTIFY": hook.url()}).code == 2
    [post] = hook.posts
    advice = post["message"].splitlines()[1]
    again = again.format(first=first)
    assert advice == f"What to do: fix that, then start the night again: {again}"
    fake_llm(monkeypatch, None, demo_tickers(2))  # fixed: the server is back
    result = run_cli(*again.split()[1:], env={"NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 0, result.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.as_of)).scalars().all() == [DEMO_AS_OF]


@pytest.mark.parametrize("name", ["server-down", "wrong-model"])
@pytest.mark.parametrize("ending", ["interrupted", "killed"])
def test_a_resume_refused_at_its_start_pushes_a_digest(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hook: Webhook,
        name: str, ending: str) -> None:
    # `nightdesk run --resume N`, the command every digest of a night cut short advises, is
    # a start too: refused, it is no more silent than a new night, and names itself again.
    from tests.unit.support.night_rows import Rated, add_night, at

    env, says = cause(name, tmp_path, monkeypatch)
    a, b = demo_tickers(2)
    created = at(DEMO_AS_OF + timedelta(days=1), 0, 10)
    night = add_night(sqlite_engine, DEMO_AS_OF, created,
                      {a: Rated("Buy", 0.7), b: Rated(status="interrupted")},
                      status="running" if ending == "killed" else "interrupted")
    result = run_cli("run", "--resume", str(night),
                     env={**env, "NIGHTDESK_NOTIFY": hook.url(),
                          "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false",
                          "NIGHTDESK_DATA_DIR": str(tmp_path / "data")})
    assert result.code == 2, result.stderr
    [error] = [line for line in result.error_lines if line.startswith("error: ")]
    assert says in error and "Traceback" not in result.stderr, result.stderr
    [post] = hook.posts
    assert post["type"] == "failure"
    assert post["title"] == (f"DEMO DATA — nightdesk: night of {DEMO_AS_OF} REFUSED at its "
                             f"start, batch #{night} not continued")  # a demo batch
    lines = post["message"].splitlines()
    assert lines[0].startswith("Why: ") and says in lines[0], lines
    assert lines[1] == f"What to do: fix that, then continue it: nightdesk run --resume {night}"
    assert batch_count(sqlite_engine) == 1  # nothing new was written


def test_a_refused_night_of_its_own_tickers_advises_the_command_as_given(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        hook: Webhook) -> None:
    # `nightdesk run --continue-night` would start the default universe instead: the advice
    # is the operator's own command line, which runs once the cause is fixed.
    env, says = cause("server-down", tmp_path, monkeypatch)
    a, b = demo_tickers(2)
    argv = ["run", "--tickers", f"{a},{b}", "--as-of", str(DEMO_AS_OF), "--samples", "2"]
    result = run_cli(*argv, env={**env, "NIGHTDESK_NOTIFY": hook.url(),
                                 "NIGHTDESK_DATA_DIR": str(tmp_path / "data")})
    assert result.code == 2, result.stderr
    [post] = hook.posts
    lines = post["message"].splitlines()
    assert says in lines[0], lines
    assert lines[1] == ("What to do: fix that, then start the night again: nightdesk "
                        + " ".join(argv)), lines


def test_a_refused_night_is_named_where_the_morning_says_stale(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: no row, so the page, `ranking` and /metrics said only "stale: no nightly batch
    # since the night due …", the why in a digest alone.
    import time_machine
    from bs4 import BeautifulSoup
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from app.config import load_settings
    from app.morning.nightstatus import night_status
    from app.morning.ranking import ranked_night
    from app.web.auth import Guard
    from app.web.reruns import RerunQueue
    from app.web.server import create_app
    from tests.unit.support.night_rows import Rated, add_night, at

    due = at(DEMO_AS_OF + timedelta(days=1), 0, 10)
    utc = {"NIGHTDESK_SCHEDULE_TIMEZONE": "UTC", "COLUMNS": "250"}
    settings = load_settings(schedule_timezone="UTC")
    before = add_night(sqlite_engine, DEMO_AS_OF - timedelta(days=1), due - timedelta(days=1),
                       {"AAA": Rated("Buy", 0.8)})
    env, says = cause("server-down", tmp_path, monkeypatch)
    with time_machine.travel(due + timedelta(seconds=20), tick=False):
        assert run_cli("run", "--continue-night", env={**env, **utc}).code == 2
    morning = due + timedelta(hours=8)
    status = night_status(sqlite_engine, settings, ranked_night(sqlite_engine), now=morning)
    named = (f"night of {DEMO_AS_OF} REFUSED at its start, no batch run "
             f"({DEMO_AS_OF + timedelta(days=1)} 00:10 UTC): ")
    assert status.status == "stale" and status.refused is not None
    assert status.reason is not None and named in status.reason and says in status.reason
    assert status.reason.endswith(f"; this ranking is of {DEMO_AS_OF - timedelta(days=1)} "
                                  f"(batch #{before})")
    assert [a.command for a in status.advice] == ["nightdesk run --continue-night"]
    with time_machine.travel(morning, tick=False):
        ranking = run_cli("ranking", env=utc)
        app = create_app(sqlite_engine, Guard("ops", "pw"), RerunQueue(), stale_after_s=120.0,
                         settings=settings)
        with TestClient(app) as client:
            page = client.get("/", auth=("ops", "pw")).text
            metrics = client.get("/metrics", auth=("ops", "pw")).text
    assert named in " ".join(ranking.stderr.split()), ranking.stderr
    assert " ".join(ranking.stderr.split()).count(says) == 1, ranking.stderr  # said once
    banner = BeautifulSoup(page, "html.parser").find(id="banner")
    assert banner is not None and named in " ".join(banner.get_text().split())
    gauges = {s.name: s.value for family in text_string_to_metric_families(metrics)
              for s in family.samples}
    assert gauges["nightdesk_night_refused_timestamp_seconds"] == \
        (due + timedelta(seconds=20)).timestamp()
    # The advice, run as given once the server is back: the night it starts supersedes it.
    fake_llm(monkeypatch, None, demo_tickers(2))
    with time_machine.travel(due + timedelta(hours=7), tick=True):
        result = run_cli(*status.advice[0].command.split()[1:],
                         env={**utc, "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 0, result.stderr
    status = night_status(sqlite_engine, settings, ranked_night(sqlite_engine), now=morning)
    assert (status.status, status.refused) == ("succeeded", None)


def test_a_refused_resume_is_named_where_the_morning_names_the_night_it_was_for(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An interrupted night; its resume refused (the server still down). Before: its digest
    # alone said so; the page, `ranking`, /api and /metrics named the night "interrupted" and
    # advised the same resume as if nothing had been tried.
    import time_machine
    from bs4 import BeautifulSoup

    from app.config import load_settings
    from app.morning.nightstatus import night_status
    from app.morning.ranking import ranked_night
    from tests.unit.support.night_rows import Rated, add_night, at
    from tests.unit.support.webclient import AUTH, web_client

    env, says = cause("server-down", tmp_path, monkeypatch)
    a, b = demo_tickers(2)
    due = at(DEMO_AS_OF + timedelta(days=1), 0, 10)
    night = add_night(sqlite_engine, DEMO_AS_OF, due,
                      {a: Rated("Buy", 0.7), b: Rated(status="interrupted")},
                      status="interrupted", error="the server stayed down")
    quick = {"NIGHTDESK_CHECK_CONTEXT_LENGTH": "false", "NIGHTDESK_SCHEDULE_TIMEZONE": "UTC",
             "NIGHTDESK_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "400"}
    settings = load_settings(schedule_timezone="UTC")
    named = f"night of {DEMO_AS_OF} REFUSED at its start, batch #{night} not continued"
    with time_machine.travel(due + timedelta(hours=2), tick=True):
        assert run_cli("run", "--resume", str(night), env={**env, **quick}).code == 2
        status = night_status(sqlite_engine, settings, ranked_night(sqlite_engine))
        assert status.status == "interrupted" and status.refused is not None
        assert status.reason is not None and named in status.reason and says in status.reason
        assert [step.command for step in status.advice] == [f"nightdesk run --resume {night}"]
        said = run_cli("ranking", "--require-fresh", env=quick).stderr
        assert named in said.splitlines()[0], said
        with web_client(sqlite_engine, settings=settings) as web:
            banner = BeautifulSoup(web.get("/", auth=AUTH).text, "html.parser").find(
                id="banner")
            assert banner is not None and named in " ".join(banner.get_text().split())
            assert named in web.get("/api/ranking", auth=AUTH).json()["night"]["reason"]
            assert "nightdesk_night_refused_timestamp_seconds" in web.get(
                "/metrics", auth=AUTH).text
        # The advice once the server is back: accepted, the night finishes, nothing stands.
        fake_llm(monkeypatch, None, [a, b])
        assert run_cli("run", "--resume", str(night), env=quick).code == 0
        status = night_status(sqlite_engine, settings, ranked_night(sqlite_engine))
    assert (status.status, status.refused) == ("succeeded", None)


@pytest.mark.parametrize("failing", ["all", "one"], ids=["failed", "partial"])
def test_a_night_of_the_date_that_ended_short_is_named_with_its_advice(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        hook: Webhook, failing: str) -> None:
    # The timer's `run --continue-night` (`systemctl start nightdesk-batch.service`) after a
    # night whose tickers failed on their own account (HTTP 400): it said "nightly batch #N
    # has already analyzed as-of D" of a failed night, and for either advised only newer
    # data or another night of the date, not what the morning advises.
    from tests.fakevllm import Reply

    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    tickers = demo_tickers(2)
    bad = [*tickers] if failing == "all" else tickers[:1]
    fake_llm(monkeypatch, lambda chat: Reply(status=400, error="bad request")
             if any(t in str(chat.body.get("messages")) for t in bad) else None, tickers)
    env = {"NIGHTDESK_NOTIFY": hook.url(), "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"}
    assert run_cli("run", env=env).code == (1 if failing == "all" else 3)
    [night] = [b.id for b in _nights(sqlite_engine)]
    bad.clear()
    result = run_cli("run", "--continue-night", env=env)
    assert result.code == 0, result.stderr
    [line] = [said for said in result.error_lines if f"#{night}" in said]
    if failing == "all":
        assert "already analyzed" not in line
        assert f"#{night} of as-of {DEMO_AS_OF} failed" in line
        advised = f"nightdesk run --resume {night} --retry-failed"
    else:
        advised = f"nightdesk rerun {tickers[0]} --as-of {DEMO_AS_OF}"
    assert f"`{advised}`" in line and f"`{advised}`" in hook.posts[-1]["message"]
    again = run_cli(*shlex.split(advised)[1:], env=env)  # as given, it rates the ticker(s)
    assert again.code == 0, again.stderr
    if failing == "all":
        assert [(b.id, b.status) for b in _nights(sqlite_engine)] == [(night, "succeeded")]


def _nights(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(Batch.id, Batch.status).order_by(Batch.id)))


def test_a_plain_runs_advice_runs_its_date_again_where_a_night_of_it_finished(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        hook: Webhook) -> None:
    # A plain `nightdesk run` analyzes its date again; refused, it was advised `nightdesk run
    # --continue-night`, which runs nothing for a date already analyzed: the advice did not
    # do what was refused. Now it names the command as given.
    from app.batch import store

    env, _ = cause("server-down", tmp_path, monkeypatch)
    done = store.create_batch(sqlite_engine, kind="nightly", as_of=DEMO_AS_OF,
                              tickers=demo_tickers(2), samples=1, settings=BatchSettings(),
                              server_facts=None)
    store.finish_batch(sqlite_engine, done, "succeeded")
    assert run_cli("run", env={**env, "NIGHTDESK_NOTIFY": hook.url()}).code == 2
    [post] = hook.posts
    advice = post["message"].splitlines()[1]
    assert advice == "What to do: fix that, then start the night again: nightdesk run"
    fake_llm(monkeypatch, None, demo_tickers(2))  # fixed: the server is back
    result = run_cli(*advice.rsplit(": ", 1)[1].split()[1:],
                     env={"NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 0, result.stderr
    assert batch_count(sqlite_engine) == 2


def test_every_command_a_run_refused_for_no_snapshot_advises_works(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        hook: Webhook) -> None:
    # Its line named `nightdesk data freeze`, which alone exits 2 (its --provider missing).
    result = run_cli("run", env={"NIGHTDESK_NOTIFY": hook.url()})
    assert result.code == 2, result.stderr
    [line] = [line for line in result.error_lines if line.startswith("error: ")]
    named = re.findall(r"`(nightdesk [^`]+)`", line)
    assert "nightdesk data demo" in named and len(named) >= 2, line
    for command in named:
        assert run_cli(*shlex.split(command)[1:]).code == 0, command
    [post] = hook.posts  # the demo data written: the digest's command runs the night
    fake_llm(monkeypatch, None, demo_tickers(3))
    again = run_cli(*post["message"].splitlines()[1].rsplit(": ", 1)[1].split()[1:],
                    env={"NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert again.code == 0, again.stderr


@pytest.mark.parametrize("newer", [True, False])
def test_a_newer_night_refused_after_a_succeeded_one_is_named_where_nights_are_listed(
        sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        newer: bool) -> None:
    # Before, only its digest told it: the morning read the succeeded night before it as
    # fresh, and `batches`, /batches, `ranking`, the page and /metrics named no refusal.
    import time_machine
    from bs4 import BeautifulSoup
    from prometheus_client.parser import text_string_to_metric_families

    from app.config import load_settings
    from app.morning.nightstatus import night_status
    from app.morning.ranking import ranked_night
    from tests.unit.support.night_rows import Rated, add_night, at
    from tests.unit.support.webclient import AUTH, web_client

    due = at(DEMO_AS_OF, 0, 10)  # the night of the date before DEMO_AS_OF ran at it
    utc = {"NIGHTDESK_SCHEDULE_TIMEZONE": "UTC", "COLUMNS": "300"}
    settings = load_settings(schedule_timezone="UTC")
    night_of = DEMO_AS_OF - timedelta(days=0 if newer else 1)
    before = add_night(sqlite_engine, DEMO_AS_OF - timedelta(days=1), due,
                       {"AAA": Rated("Buy", 0.8)})
    env, says = cause("server-down", tmp_path, monkeypatch)
    with time_machine.travel(due + timedelta(hours=9), tick=False):  # off the schedule
        assert run_cli("run", "--as-of", str(night_of), env={**env, **utc}).code == 2
    morning = due + timedelta(hours=10)
    status = night_status(sqlite_engine, settings, ranked_night(sqlite_engine), now=morning)
    named = f"night of {night_of} REFUSED at its start, no batch run"
    with time_machine.travel(morning, tick=False):
        said = {"ranking": run_cli("ranking", env={**env, **utc}).stderr,
                "batches": run_cli("batches", env={**env, **utc}).stderr}
        with web_client(sqlite_engine, settings=settings) as client:
            for path in ("/", "/batches"):
                said[path] = BeautifulSoup(client.get(path, auth=AUTH).text,
                                           "html.parser").get_text()
            metrics = client.get("/metrics", auth=AUTH).text
    gauges = {s.name: s.value for family in text_string_to_metric_families(metrics)
              for s in family.samples}
    assert status.status == "succeeded" and status.latest is not None
    assert status.latest.id == before
    # A refusal of the date ranked (or an older one) leaves that ranking the newest.
    assert (status.refused is not None, status.fresh) == (newer, not newer)
    assert {face: named in " ".join(text.split()) for face, text in said.items()} == \
        dict.fromkeys(said, newer), said
    assert ("nightdesk_night_refused_timestamp_seconds" in gauges) == newer
    assert gauges["nightdesk_night_ranking_fresh"] == (0.0 if newer else 1.0)
    if newer:
        assert status.reason is not None and says in status.reason
        assert [a.command for a in status.advice] == [f"nightdesk run --as-of {night_of}"]
