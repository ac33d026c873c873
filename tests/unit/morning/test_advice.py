"""Every command nightdesk advises works for the batch it names.

For each way a night can end, the night is stored, every piece of advice the digest, the
ranking page's banner, the batch's page, ``nightdesk ranking`` and ``nightdesk report`` give
is collected, and each command is then run through the CLI (``app.cli.main``, as an
operator would) against a fake vLLM: none may answer the usage error (2) or "no tickers
left". The advice is read
from the messages themselves, not from ``app.morning.advice``, so a message that advises something
of its own is run too.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import time_machine
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.config import load_settings
from app.db.models import Batch
from app.morning.digest import build_digest
from tests.unit.support.clirun import run_cli
from tests.unit.support.engines import fake_llm
from tests.unit.support.night_rows import Rated, add_night, at
from tests.unit.support.webclient import PASSWORD, USER

# The night of DEMO_AS_OF, stored as it began at CREATED; viewed a few hours later.
CREATED = at(DEMO_AS_OF + timedelta(days=1), 0, 10)
VIEWED = CREATED + timedelta(hours=6)
# A command named anywhere: "nightdesk WORD …" up to a bracket, backtick, semicolon or the end.
ADVISED = re.compile(r"(nightdesk [a-z][^`();\n]*?)\s*(?=\(|`|;|$)")
FAILURE = "LLMTimeoutError: no answer within 600 s"


def nights(a: str, b: str, c: str) -> dict[str, tuple[dict[str, Rated], str | None]]:
    """Each terminal status and the tickers it leaves: (tickers, stored status)."""
    return {
        "succeeded": ({a: Rated("Buy", 0.7), b: Rated("Hold", 0.0)}, None),
        "partial": ({a: Rated("Buy", 0.7), b: Rated(error=FAILURE)}, None),
        # Every ticker failed: nothing is left to resume; the failed ones run again in it.
        "failed": ({a: Rated(error=FAILURE), b: Rated(error=FAILURE)}, None),
        # Stopped by a refused model before any ticker ran: all of them are left.
        "failed-at-start": ({a: Rated(status="queued"), b: Rated(status="queued")}, "failed"),
        "interrupted": ({a: Rated("Buy", 0.7), b: Rated(status="interrupted"),
                         c: Rated(error=FAILURE)}, "interrupted"),
        "crashed": ({a: Rated("Buy", 0.7), b: Rated(status="interrupted")}, "crashed"),
        # SIGKILLed: still marked running, its heartbeat hours old.
        "killed": ({a: Rated("Buy", 0.7), b: Rated(status="running"),
                    c: Rated(status="queued")}, "running"),
        "crashed-after-its-last-ticker": ({a: Rated("Buy", 0.7), b: Rated(error=FAILURE)},
                                          "crashed"),
    }


def advice_given(engine: Engine, client: TestClient, batch_id: int,
                 viewed: datetime = VIEWED) -> set[str]:
    """Return every command the digest, the banner, the batch's page, the list of batches
    (where it names a refusal), the API, ranking and report advise at ``viewed``."""
    env = {"NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
    with time_machine.travel(viewed, tick=False):
        texts = [build_digest(engine, load_settings(), batch_id).message.body]
        page = BeautifulSoup(client.get("/", auth=(USER, PASSWORD)).text, "html.parser")
        banner = page.find(id="banner")
        texts.append(banner.get_text(" ") if banner is not None else "")
        texts.extend(code.get_text() for code in page.select("#banner code"))
        batches = BeautifulSoup(client.get("/batches", auth=(USER, PASSWORD)).text,
                                "html.parser").find(id="refused")
        texts.append(batches.get_text(" ") if batches is not None else "")
        texts.extend(step["command"] for step in client.get(
            "/api/ranking", auth=(USER, PASSWORD)).json()["night"]["advice"])
        batch_page = BeautifulSoup(client.get(f"/batches/{batch_id}", auth=(USER, PASSWORD))
                                   .text, "html.parser")
        meta = batch_page.select_one(".meta")
        texts.append(" ".join(meta.get_text().split()) if meta is not None else "")
        texts.extend(code.get_text() for code in batch_page.select("#advice code"))
        texts.append(run_cli("ranking", env=env).stderr)
        texts.append(run_cli("batches", env=env).stderr)
        report = run_cli("report", str(batch_id), env=env)
        texts.extend([report.stdout, report.stderr])
        texts.extend(step["command"] for step in json.loads(run_cli(
            "report", str(batch_id), "--format", "json", env=env).stdout)["advice"])
    found = {match.group(1) for text in texts for line in text.splitlines()
             for match in ADVISED.finditer(line)}
    # `nightdesk report N`, named when more advice than fits is left out, needs no run.
    return {command for command in found if not command.startswith("nightdesk report ")}


def night_before(engine: Engine, a: str, b: str) -> None:
    """Store the night before: the ranking's banner then has an older night to show."""
    add_night(engine, DEMO_AS_OF - timedelta(days=1), CREATED - timedelta(days=1),
              {a: Rated("Hold", 0.1), b: Rated("Hold", 0.0)})


@pytest.mark.parametrize("ending", list(nights("A", "B", "C")))
def test_every_piece_of_advice_is_accepted_by_the_cli(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, client: TestClient,
        demo_dir: Path, ending: str) -> None:
    a, b, c = demo_tickers(3)
    tickers, status = nights(a, b, c)[ending]
    night_before(sqlite_engine, a, b)
    night = add_night(sqlite_engine, DEMO_AS_OF, CREATED, tickers, status=status,
                      error=None if status in (None, "running") else
                      f"{ending}; resume with `nightdesk run --resume`",
                      heartbeat=CREATED + timedelta(minutes=5))
    advised = advice_given(sqlite_engine, client, night)
    ended_short = ending not in ("succeeded",)
    assert bool(advised) == ended_short, advised
    fake_llm(monkeypatch, None, [a, b, c])
    env = {"NIGHTDESK_DATA_DIR": str(demo_dir), "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"}
    for command in sorted(advised):
        argv = shlex.split(command)
        assert argv[0] == "nightdesk"
        # No vLLM to ask here: the batch commands skip their preflight, the fake answers.
        skip = ["--no-preflight"] if argv[1] in ("run", "rerun") else []
        result = run_cli(*argv[1:], *skip, env=env)
        assert "no tickers left" not in result.stderr, (command, result.stderr)
        # Accepted and run to its end: 0, or 3 when a ticker failed before stays failed.
        assert result.code in (0, 3), (command, result.code, result.stderr)


def test_a_failed_night_is_advised_the_resume_that_gets_it_ranked(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, client: TestClient,
        demo_dir: Path) -> None:
    # Before: `nightdesk rerun A --as-of D` for each ticker, "the ranking applies it"; but no
    # ranking shows a failed night, so each rerun's digest said "No finished night of D to
    # apply it to" and the morning kept the night before.
    a, b, _ = demo_tickers(3)
    night_before(sqlite_engine, a, b)
    night = add_night(sqlite_engine, DEMO_AS_OF, CREATED,
                      {a: Rated(error=FAILURE), b: Rated(error=FAILURE)})
    [command] = advice_given(sqlite_engine, client, night)
    assert command == f"nightdesk run --resume {night} --retry-failed"
    fake_llm(monkeypatch, None, [a, b])
    env = {"NIGHTDESK_DATA_DIR": str(demo_dir), "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"}
    assert run_cli(*shlex.split(command)[1:], "--no-preflight", env=env).code == 0
    shown = json.loads(run_cli("ranking", "--format", "json").stdout)["batch"]
    assert (shown["id"], shown["status"]) == (night, "succeeded")


def test_the_advice_follows_what_resume_takes_up(sqlite_engine: Engine,
                                                  client: TestClient) -> None:
    a, b, c = demo_tickers(3)
    night_before(sqlite_engine, a, b)
    night = add_night(sqlite_engine, DEMO_AS_OF, CREATED, {
        a: Rated("Buy", 0.7), b: Rated(status="interrupted"), c: Rated(error=FAILURE)},
        status="interrupted")
    # B is left (resume takes it up; C's failure it leaves alone).
    assert advice_given(sqlite_engine, client, night) == {f"nightdesk run --resume {night}"}
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status).where(Batch.id == night)).scalar() == \
            "interrupted"


def test_a_failed_rerun_redone_by_a_later_rerun_advises_nothing(sqlite_engine: Engine,
                                                                 client: TestClient) -> None:
    # A rerun that failed kept advising its own rerun after a later one had succeeded,
    # while its night, rightly, advised nothing more.
    a, b, _ = demo_tickers(3)
    night = add_night(sqlite_engine, DEMO_AS_OF, CREATED,
                      {a: Rated("Buy", 0.7), b: Rated(error=FAILURE)})
    failed = add_night(sqlite_engine, DEMO_AS_OF, CREATED + timedelta(hours=1),
                       {b: Rated(error=FAILURE)}, kind="rerun")
    assert advice_given(sqlite_engine, client, failed) == {
        f"nightdesk rerun {b} --as-of {DEMO_AS_OF}"}
    add_night(sqlite_engine, DEMO_AS_OF, CREATED + timedelta(hours=2),
              {b: Rated("Hold", 0.1)}, kind="rerun")
    assert advice_given(sqlite_engine, client, failed) == set()
    assert advice_given(sqlite_engine, client, night) == set()


def test_report_and_ranking_give_advice_in_one_json_shape(sqlite_engine: Engine) -> None:
    # A script reads `advice` the same way from either JSON face: `{command, does}` objects.
    a, b, _ = demo_tickers(3)
    night = add_night(sqlite_engine, DEMO_AS_OF, CREATED,
                      {a: Rated("Buy", 0.7), b: Rated(error=FAILURE)})
    env = {"NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
    with time_machine.travel(VIEWED, tick=False):
        report = json.loads(run_cli("report", str(night), "--format", "json",
                                    env=env).stdout)["advice"]
        ranking = json.loads(run_cli("ranking", "--format", "json", env=env).stdout)
    assert ranking["night"]["latest"]["id"] == night
    assert report == ranking["night"]["advice"] == [
        {"command": f"nightdesk rerun {b} --as-of {DEMO_AS_OF}",
         "does": f"runs {b} again; the ranking applies it"}]


def test_report_and_the_batch_page_tell_not_finished_from_failed(
        sqlite_engine: Engine, client: TestClient) -> None:
    a, b, c = demo_tickers(3)
    night = add_night(sqlite_engine, DEMO_AS_OF, CREATED, {
        a: Rated("Buy", 0.7), b: Rated(status="interrupted", error="stopped by SIGTERM"),
        c: Rated(status="interrupted", error="stopped by SIGTERM")},
        status="interrupted", error="stopped by SIGTERM: finished tickers are kept; "
                                    "`nightdesk run --resume` completes the batch")
    lines = run_cli("report", str(night), env={"COLUMNS": "250"}).stdout.splitlines()
    assert lines[0].endswith("interrupted — 1 of 3 tickers succeeded, 0 failed, 2 not "
                             "finished; duration 40 min 00 s")
    assert lines[1:5] == [
        "  error: stopped by SIGTERM: finished tickers are kept",
        f"  next: nightdesk run --resume {night} (continues its 2 tickers not finished)",
        "tickers without a result (2):",
        f"  {b} (interrupted): stopped by SIGTERM"]
    page = BeautifulSoup(client.get(f"/batches/{night}", auth=(USER, PASSWORD)).text,
                         "html.parser")
    meta = " ".join(page.select_one(".meta").get_text().split())  # type: ignore[union-attr]
    assert "1 of 3 tickers succeeded, 0 failed, 2 not finished." in meta
    assert "`" not in meta
    assert [code.get_text() for code in page.select("#advice code")] == [
        f"nightdesk run --resume {night}"]


def test_a_morning_with_no_night_since_the_due_time_is_advised_to_start_it(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, client: TestClient,
        demo_dir: Path) -> None:
    # The night before succeeded; tonight's never came (the timer or daemon did not fire):
    # stale, with nothing of the latest batch's to redo. The morning still says what to do,
    # and that command starts the night on the newest snapshot.
    a, b, c = demo_tickers(3)
    night_before(sqlite_engine, a, b)
    with time_machine.travel(VIEWED, tick=False):
        status = json.loads(run_cli("ranking", "--format", "json",
                                    env={"NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}).stdout)
    assert status["night"]["status"] == "stale"
    advised = advice_given(sqlite_engine, client, status["batch"]["id"])
    assert advised == {"nightdesk run --continue-night"}
    fake_llm(monkeypatch, None, [a, b, c])
    result = run_cli("run", "--continue-night", "--no-preflight",
                     env={"NIGHTDESK_DATA_DIR": str(demo_dir),
                          "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 0, result.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.as_of).where(Batch.kind == "nightly")
                            .order_by(Batch.id.desc())).scalars().first() == DEMO_AS_OF


@pytest.mark.parametrize("told", [True, False], ids=["its-notice-told", "no-fire-yet"])
def test_a_stale_morning_whose_date_was_analyzed_is_advised_what_analyzes_it_again(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, client: TestClient,
        demo_dir: Path, told: bool) -> None:
    # The night of the newest snapshot succeeded; the next due time passed with no newer
    # snapshot. Every face advised `nightdesk run --continue-night`, which only says "night of
    # D already analyzed by nightly batch #N, nothing run" (again: nothing at all, once told).
    a, b, c = demo_tickers(3)
    night = add_night(sqlite_engine, DEMO_AS_OF, CREATED,
                      {a: Rated("Buy", 0.7), b: Rated("Hold", 0.0), c: Rated("Sell", -0.5)})
    fake_llm(monkeypatch, None, [a, b, c])
    env = {"NIGHTDESK_DATA_DIR": str(demo_dir), "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false",
           "NIGHTDESK_SCHEDULE_TIMEZONE": "UTC"}
    viewed = VIEWED + timedelta(days=1)  # the next night was due 18 hours ago
    with time_machine.travel(viewed - timedelta(hours=1), tick=False):
        if told:  # the timer's fire: the notice, no batch
            fired = run_cli("run", "--continue-night", "--no-preflight", env=env)
            assert fired.code == 0 and "already analyzed" in fired.stderr, fired.stderr
    with time_machine.travel(viewed, tick=False):
        status = json.loads(run_cli("ranking", "--format", "json", env=env).stdout)["night"]
    assert status["status"] == "stale"
    assert (status["refused"] is not None) == told
    advised = advice_given(sqlite_engine, client, night, viewed)
    assert advised == {f"nightdesk run --as-of {DEMO_AS_OF}", "nightdesk data freeze --help"}
    for command in sorted(advised):
        argv = shlex.split(command)[1:]
        result = run_cli(*argv, *(["--no-preflight"] if argv[0] == "run" else []), env=env)
        assert result.code == 0, (command, result.stderr)
    # It did what it says: a new nightly batch of the date, ranked.
    shown = json.loads(run_cli("ranking", "--format", "json", env=env).stdout)["batch"]
    assert (shown["as_of"], shown["status"]) == (str(DEMO_AS_OF), "succeeded")
    assert shown["id"] != night


@pytest.mark.parametrize(("left", "does"), [
    ("failed", "runs again its 1 ticker the server or database failed"),
    ("interrupted", "continues its 1 ticker not finished and runs again the 1 ticker the "
                    "server or database failed"),
])
def test_a_resume_says_how_many_it_continues_and_how_many_it_runs_again(
        sqlite_engine: Engine, client: TestClient, left: str, does: str) -> None:
    # A ticker the server failed did finish (failed): a resume runs it again. Calling it
    # "not finished" beside "2 failed" in the same report contradicted the status line.
    from sqlalchemy import update

    from app.db.models import INFRASTRUCTURE, TickerRun

    a, b, c = demo_tickers(3)
    night = add_night(sqlite_engine, DEMO_AS_OF, CREATED, {
        a: Rated("Buy", 0.7), b: Rated(error="HTTP 500: boom"),
        c: Rated(error=FAILURE) if left == "failed" else Rated(status="interrupted")},
        status=None if left == "failed" else "interrupted")
    with sqlite_engine.begin() as conn:
        conn.execute(update(TickerRun).where(TickerRun.batch_id == night,
                                             TickerRun.ticker == b)
                     .values(failure_class=INFRASTRUCTURE))
    report = run_cli("report", str(night), env={"COLUMNS": "250"}).stdout.splitlines()
    assert f"  next: nightdesk run --resume {night} ({does})" in report, report[:4]
    with time_machine.travel(VIEWED, tick=False):
        body = build_digest(sqlite_engine, load_settings(), night).message.body
    assert f"Next: nightdesk run --resume {night} ({does})" in body.splitlines()


def test_a_partial_night_whose_failed_tickers_a_rerun_redid_advises_no_resume(
        sqlite_engine: Engine, client: TestClient) -> None:
    # A partial night whose ticker the server failed, then rerun by hand and rated: the
    # ranking shows the rerun's rating (no ticker missing, no banner), yet ranking, report
    # and the digest kept advising `nightdesk run --resume N` "runs again its 1 ticker the
    # server or database failed", whose result the ranking would never show (it applies the
    # rerun, started after the night, over the night's own row).
    from sqlalchemy import update

    from app.db.models import INFRASTRUCTURE, TickerRun

    a, b, c = demo_tickers(3)
    night = add_night(sqlite_engine, DEMO_AS_OF, CREATED, {
        a: Rated("Buy", 0.7), b: Rated(error="HTTP 500: boom"), c: Rated(error="HTTP 500: boom")})
    with sqlite_engine.begin() as conn:
        conn.execute(update(TickerRun).where(TickerRun.batch_id == night)
                     .values(failure_class=INFRASTRUCTURE))
    add_night(sqlite_engine, DEMO_AS_OF, CREATED + timedelta(hours=1),
              {b: Rated("Hold", 0.1)}, kind="rerun")
    # C is still missing: the resume runs both (it takes up what it takes up), as it says.
    assert advice_given(sqlite_engine, client, night) == {f"nightdesk run --resume {night}"}
    add_night(sqlite_engine, DEMO_AS_OF, CREATED + timedelta(hours=2),
              {c: Rated("Hold", 0.2)}, kind="rerun")
    assert advice_given(sqlite_engine, client, night) == set()


def test_a_resume_refused_names_the_rerun_that_rated_a_failed_ticker_not_a_retry(
        sqlite_engine: Engine) -> None:
    # A partial night whose ticker failed on its own account, then rerun and rated: the
    # advice is rightly none, but `run --resume N` answered "1 failed on their own account:
    # `nightdesk run --resume N --retry-failed` runs them again", a retry whose rating the
    # ranking would never show (it applies the rerun over the night's own row).
    a, b, _ = demo_tickers(3)
    night = add_night(sqlite_engine, DEMO_AS_OF, CREATED,
                      {a: Rated("Buy", 0.7), b: Rated(error=FAILURE)})
    before = run_cli("run", "--resume", str(night))
    assert before.code == 2
    assert f"`nightdesk run --resume {night} --retry-failed` runs them again" in before.stderr
    rerun = add_night(sqlite_engine, DEMO_AS_OF, CREATED + timedelta(hours=1),
                      {b: Rated("Hold", 0.1)}, kind="rerun")
    after = run_cli("run", "--resume", str(night))
    assert after.code == 2
    assert after.error_lines == [f"error: batch {night} (partial) has no tickers left to run; "
                                 f"{b} failed, rated since by rerun #{rerun}"]
