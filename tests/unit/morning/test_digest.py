"""The morning digest: its content from stored rows, sent by every path a batch ends on.

Night 1 (D1): T00…T11 with the scores and ratings of NIGHT1. Night 2 (D2): the same, except
T06 Hold +0.00 → Buy +0.95 (an upgrade), T03 Overweight +0.45 → Hold +0.05 (a downgrade),
T11 failed ("LLMTimeoutError: no answer within 600 s"); 40 minutes from start to end; 10
calls of 5 output tokens each, one a second for 1 s: 50 tokens over 10 s = 5.0 tok/s.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.batch.engine import BatchOutcome
from app.config import load_settings
from app.db.models import Batch
from app.morning.digest import build_digest, send_digest
from app.morning.summary import applied_reruns
from app.notify import Message, send, split_destinations
from tests.fakevllm import ChatRequest, Reply
from tests.unit.support.clirun import run_cli
from tests.unit.support.engines import fake_llm
from tests.unit.support.night_rows import Rated, add_night, add_resumed_calls, at
from tests.unit.support.sigterm import sigterm_at_first
from tests.webhook import closed_port, webhook

D1, D2 = date(2026, 11, 26), date(2026, 11, 27)
NIGHT1 = {"T00": ("Buy", 0.9), "T01": ("Buy", 0.75), "T02": ("Buy", 0.6),
          "T03": ("Overweight", 0.45), "T04": ("Overweight", 0.3), "T05": ("Overweight", 0.2),
          "T06": ("Hold", 0.0), "T07": ("Hold", -0.1), "T08": ("Underweight", -0.3),
          "T09": ("Underweight", -0.45), "T10": ("Sell", -0.6), "T11": ("Sell", -0.75)}


def two_nights(engine: Engine) -> tuple[int, int]:
    first = add_night(engine, D1, at(D2, 0, 10),
                      {t: Rated(rating, score) for t, (rating, score) in NIGHT1.items()})
    second = {t: Rated(rating, score) for t, (rating, score) in NIGHT1.items()}
    second["T06"] = Rated("Buy", 0.95)
    second["T03"] = Rated("Hold", 0.05)
    second["T11"] = Rated(error="LLMTimeoutError: no answer within 600 s")
    return first, add_night(engine, D2, at(date(2026, 11, 28), 0, 10), second, calls=10)


def test_a_resumed_nights_rate_is_over_the_time_it_ran_its_pause_named(
        sqlite_engine: Engine) -> None:
    night = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10),
                      {"T00": Rated("Buy", 0.9)}, minutes=130)
    add_resumed_calls(sqlite_engine, night, at(date(2026, 11, 28), 0, 10))
    body = build_digest(sqlite_engine, load_settings(), night).message.body
    assert body.splitlines()[1] == ("Duration: 2 h 10 min; output 80.0 tok/s (16000 tokens "
                                    "over 3 min 20 s of calls; 2 h 00 min paused in 1 pause, "
                                    "not counted); 2 calls (4 attempts, 0 failed)")


def test_the_digest_says_status_tickers_ends_changes_failures_time_rate_and_link(
        sqlite_engine: Engine) -> None:
    first, night = two_nights(sqlite_engine)
    settings = load_settings(web_base_url="https://desk.example.org/")
    digest = build_digest(sqlite_engine, settings, night)
    title, body = digest.message.title, digest.message.body
    assert digest.message.level == "warning"  # partial
    assert title == (f"DEMO DATA — nightdesk: nightly batch #{night} (as of {D2}) PARTIAL, "
                     "11/12 tickers")
    lines = body.splitlines()
    assert lines[0] == "Status: partial: 11 of 12 tickers succeeded, 1 failed"
    assert lines[1] == ("Duration: 40 min 00 s; output 5.0 tok/s (50 tokens over 10 s of "
                        "calls); 10 calls (10 attempts, 0 failed)")
    # Ranked by score: T06 .95, T00 .90, T01 .75, T02 .60, T04 .30, T05 .20, T03 .05, …
    top = next(line for line in lines if line.startswith("Top 5"))
    assert top == ("Top 5: 1. T06 Buy +0.95; 2. T00 Buy +0.90; 3. T01 Buy +0.75; "
                   "4. T02 Buy +0.60; 5. T04 Overweight +0.30")
    bottom = next(line for line in lines if line.startswith("Bottom 5"))
    assert bottom == ("Bottom 5: 7. T03 Hold +0.05; 8. T07 Hold -0.10; "
                      "9. T08 Underweight -0.30; 10. T09 Underweight -0.45; 11. T10 Sell -0.60")
    at_changes = lines.index(f"Rating changes since {D1} (batch #{first}): 3")
    changes = lines[at_changes + 1: at_changes + 4]
    # Largest score move first; dropped last.
    assert changes[0].startswith("  T06: Hold → Buy (+0.00 → +0.95, +0.95) upgrade; ")
    assert changes[1].startswith("  T03: Overweight → Hold (+0.45 → +0.05, -0.40) downgrade; ")
    assert changes[2].startswith("  T11: dropped, was Sell")
    assert lines[2] == (f"Next: nightdesk rerun T11 --as-of {D2} (runs T11 again; the ranking "
                        "applies it)")
    at_failed = lines.index("Failed (1):")
    assert lines[at_failed + 1] == "  T11: LLMTimeoutError: no answer within 600 s"
    assert lines[-1] == (f"Page: https://desk.example.org/ "
                         f"(this batch: https://desk.example.org/batches/{night})")


def test_a_night_cut_short_says_how_to_continue_and_lists_only_up_and_downgrades(
        sqlite_engine: Engine) -> None:
    add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Hold", 0.0),
                                                 "BBB": Rated("Buy", 0.7)})
    cut = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10), {
        "AAA": Rated("Buy", 0.8),
        "BBB": Rated(status="interrupted", error="stopped by SIGTERM")},
        status="interrupted", error="stopped by SIGTERM: finished tickers are kept")
    digest = build_digest(sqlite_engine, load_settings(), cut)
    body = digest.message.body
    assert digest.message.level == "failure"
    assert "INTERRUPTED, 1/2 tickers" in digest.message.title
    lines = body.splitlines()
    assert lines[0] == ("Status: interrupted: 1 of 2 tickers succeeded, 0 failed, "
                        "1 not finished — stopped by SIGTERM: finished tickers are kept")
    assert f"Next: nightdesk run --resume {cut} (continues its 1 ticker not finished)" in lines
    assert "  AAA: Hold → Buy (+0.00 → +0.80, +0.80) upgrade" in body
    assert "BBB: dropped" not in body  # not reached is no news
    assert "Failed" not in body  # nothing failed: BBB was not finished
    unfinished = lines.index("Not finished (1):")
    assert lines[unfinished + 1] == "  BBB: stopped by SIGTERM"


def test_an_unfinished_night_with_no_change_yet_says_so_far_over_how_many(
        sqlite_engine: Engine) -> None:
    # Before: "Rating changes since 2026-11-26 (batch #1): none", of a night that rated one
    # ticker of three: not known for the two it never reached.
    before = add_night(sqlite_engine, D1, at(D2, 0, 10), {
        "AAA": Rated("Hold", 0.0), "BBB": Rated("Buy", 0.7), "CCC": Rated("Sell", -0.7)})
    cut = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10), {
        "AAA": Rated("Hold", 0.1), "BBB": Rated(status="interrupted"),
        "CCC": Rated(status="queued")}, status="interrupted", error="stopped by SIGTERM")
    lines = build_digest(sqlite_engine, load_settings(), cut).message.body.splitlines()
    assert (f"Rating changes since {D1} (batch #{before}), 1 of 3 tickers rated on both "
            "nights so far: none") in lines


def test_a_failed_night_s_changes_say_over_how_many_without_so_far(
        sqlite_engine: Engine) -> None:
    # Every ticker failed: the night is over, nothing more will be rated ("so far" was wrong).
    before = add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Hold", 0.0),
                                                          "BBB": Rated("Buy", 0.7)})
    failed = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10), {
        "AAA": Rated(error="HTTP 400: prompt rejected"),
        "BBB": Rated(error="HTTP 400: prompt rejected")})
    lines = build_digest(sqlite_engine, load_settings(), failed).message.body.splitlines()
    assert (f"Rating changes since {D1} (batch #{before}), 0 of 2 tickers rated on both "
            "nights: none") in lines


def test_a_rerun_with_no_night_to_apply_to_lists_no_ticker_dropped(
        sqlite_engine: Engine) -> None:
    # Its date's night failed (not ranked): before, the rerun's one ticker beside the night
    # before read "BBB: dropped, was Buy (not among the tickers of batch #3 …)".
    add_night(sqlite_engine, D1, at(D2, 0, 10), {"AAA": Rated("Hold", 0.0),
                                                 "BBB": Rated("Buy", 0.7)})
    night = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 0, 10), {
        "AAA": Rated(error="boom"), "BBB": Rated(error="boom")})
    rerun = add_night(sqlite_engine, D2, at(date(2026, 11, 28), 3, 0),
                      {"AAA": Rated("Buy", 0.6)}, kind="rerun")
    body = build_digest(sqlite_engine, load_settings(), rerun).message.body
    # Resumed to its end (`run --resume N --retry-failed`), that night's ranking applies it.
    assert (f"Not applied yet: nightly batch #{night} of {D2} is failed, not ranked; its "
            "ranking applies this rerun once it ends succeeded or partial") in body, body
    assert "dropped" not in body and "Rating changes" not in body, body


def test_a_rerun_ended_while_its_dates_night_runs_says_that_night_will_apply_it(
        sqlite_engine: Engine) -> None:
    # `nightdesk rerun T` while the night of T's date still runs: before, its digest said
    # "No finished night of D to apply it to", and the night's digest, minutes later,
    # "Reruns applied: T from rerun #R" (the ranking applies a rerun started after its night).
    now = datetime.now(UTC)
    night = add_night(sqlite_engine, D2, now - timedelta(minutes=2), {
        "AAA": Rated(status="running"), "BBB": Rated(status="queued")},
        status="running", heartbeat=now)
    rerun = add_night(sqlite_engine, D2, now - timedelta(minutes=1),
                      {"AAA": Rated("Buy", 0.6)}, kind="rerun")
    body = build_digest(sqlite_engine, load_settings(), rerun).message.body
    assert (f"Not applied yet: nightly batch #{night} of {D2} is running, not ranked; its "
            "ranking applies this rerun once it ends succeeded or partial") in body, body
    assert "No finished night" not in body
    with Session(sqlite_engine) as session:
        assert rerun in [b.id for b in session.scalars(applied_reruns(night, D2))]


def test_no_destination_builds_and_sends_nothing(sqlite_engine: Engine,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _, night = two_nights(sqlite_engine)
    monkeypatch.setattr("app.morning.digest.build_digest", lambda *_: pytest.fail("built"))
    send_digest(load_settings(), sqlite_engine, BatchOutcome(night, "partial"))


def test_a_digest_that_cannot_be_built_is_logged_and_never_raised(
        sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    _, night = two_nights(sqlite_engine)

    def broken(*_: Any) -> None:
        raise RuntimeError("ranking unreadable")

    monkeypatch.setattr("app.morning.digest.build_digest", broken)
    with webhook() as hook, structlog.testing.capture_logs() as logs:
        send_digest(load_settings(notify=hook.url()), sqlite_engine,
                    BatchOutcome(night, "partial"))
    assert hook.posts == []
    assert [(e["event"], e["log_level"]) for e in logs] == [("digest not built", "error")]


def test_a_comma_inside_a_query_stays_in_its_url() -> None:
    assert split_destinations(" json://a:1/x , mailto://u:p@h.org?to=a@h.org,b@h.org,, "
                              "ntfy://topic") == [
        "json://a:1/x", "mailto://u:p@h.org?to=a@h.org,b@h.org", "ntfy://topic"]


def test_send_reaches_every_destination_and_names_the_dead_one() -> None:
    dead = f"json://127.0.0.1:{closed_port()}/gone"
    with webhook() as one, webhook() as two, structlog.testing.capture_logs() as logs:
        settings = load_settings(notify=f"{one.url('a')},{dead},{two.url('b')}")
        delivery = send(settings.notify.urls, Message("title", "body", "warning"),
                        settings.notify.timeout_s)
    assert (delivery.sent, delivery.total) == (2, 3)
    assert [p["title"] for p in one.posts + two.posts] == ["title", "title"]
    assert one.posts[0]["type"] == "warning" and one.posts[0]["message"] == "body"
    [failure] = [e for e in logs if e["event"] == "notification not delivered"]
    assert failure["log_level"] == "error" and "Connection error" in failure["reason"]


# --- every path a batch ends on sends it ------------------------------------------------------


def fail_ticker(ticker: str) -> Any:
    def script(chat: ChatRequest) -> Reply | None:
        # Not retryable (a 400): the ticker fails at once.
        return Reply(status=400, error="prompt rejected") if chat.ticker == ticker else None
    return script


def test_a_night_run_from_the_cli_sends_its_digest_and_a_dead_destination_changes_nothing(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    good, bad = demo_tickers(2)
    fake_llm(monkeypatch, fail_ticker(bad), [good, bad])
    dead = f"json://127.0.0.1:{closed_port()}/gone"
    with webhook() as hook:
        result = run_cli("run", "--tickers", f"{good},{bad}", "--as-of", str(DEMO_AS_OF),
                         "--no-preflight",
                         env={"NIGHTDESK_NOTIFY": f"{dead},{hook.url()}",
                              "NIGHTDESK_DATA_DIR": str(demo_dir),
                              "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 3, result.stderr  # partial, exactly as without a digest
    with sqlite_engine.connect() as conn:
        night = conn.execute(select(Batch.id, Batch.status)).one()
    assert night.status == "partial"
    [post] = hook.posts
    assert post["title"].endswith(f"nightly batch #{night.id} (as of {DEMO_AS_OF}) "
                                  "PARTIAL, 1/2 tickers")
    assert post["type"] == "warning"
    assert f"  {bad}: " in post["message"] and "prompt rejected" in post["message"]
    assert f"Top 1: 1. {good} Overweight +0.40" in post["message"]
    assert "notification not delivered" in result.stderr  # the dead one, logged as an error


def test_a_rerun_sends_its_digest(monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine,
                                  demo_dir: Path) -> None:
    ticker = demo_tickers(1)[0]
    fake_llm(monkeypatch, None, [ticker])
    with webhook() as hook:
        result = run_cli("rerun", ticker, "--as-of", str(DEMO_AS_OF), "--no-preflight",
                         env={"NIGHTDESK_NOTIFY": hook.url(),
                              "NIGHTDESK_DATA_DIR": str(demo_dir),
                              "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 0, result.stderr
    [post] = hook.posts
    assert "rerun #1" in post["title"] and "SUCCEEDED, 1/1 tickers" in post["title"]
    assert f"Rerun: {ticker} Overweight +0.40" in post["message"]
    assert f"/ticker/{ticker}" in post["message"]


def test_a_continued_night_sends_the_digest_of_the_whole_night(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    from tests.unit.support.night_rows import dead_night

    done, left = demo_tickers(2)
    dead = dead_night(sqlite_engine, done, left)
    fake_llm(monkeypatch, None, [done, left])
    with webhook() as hook:
        result = run_cli("run", "--continue-night", "--as-of", str(DEMO_AS_OF),
                         "--no-preflight", "--tickers", done,
                         env={"NIGHTDESK_NOTIFY": hook.url(),
                              "NIGHTDESK_DATA_DIR": str(demo_dir),
                              "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 0, result.stderr
    [post] = hook.posts
    assert f"nightly batch #{dead}" in post["title"] and "SUCCEEDED, 2/2" in post["title"]


def test_a_night_stopped_by_sigterm_sends_an_interrupted_digest(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path) -> None:
    from tests.fakevllm import default_reply

    tickers = demo_tickers(2)
    script = sigterm_at_first("bull_r1", lambda chat: Reply(default_reply(chat), delay_s=0.3))
    fake_llm(monkeypatch, script, tickers)
    with webhook() as hook:
        result = run_cli("run", "--tickers", ",".join(tickers), "--as-of", str(DEMO_AS_OF),
                         "--no-preflight",
                         env={"NIGHTDESK_NOTIFY": hook.url(), "NIGHTDESK_SHUTDOWN_GRACE_S": "10",
                              "NIGHTDESK_DATA_DIR": str(demo_dir),
                              "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 130, result.stderr
    with sqlite_engine.connect() as conn:
        night = conn.execute(select(Batch.id, Batch.status, Batch.error)).one()
    assert night.status == "interrupted"
    # Stopped at the first bull_r1, its grace taking no new call: no ticker finished, and
    # nothing says "finished tickers are kept" of none.
    assert night.error == (f"stopped by SIGTERM before any ticker finished; resume with "
                           f"`nightdesk run --resume {night.id}`"), night.error
    [post] = hook.posts
    assert "finished tickers are kept" not in post["message"], post["message"]
    assert f"nightly batch #{night.id} (as of {DEMO_AS_OF}) INTERRUPTED" in post["title"]
    assert post["type"] == "failure"
    assert f"Next: nightdesk run --resume {night.id} (" in post["message"]
    assert post["message"].count("--resume") == 1  # once, not in the errors as well
    assert "stopped by SIGTERM" in post["message"]


@pytest.mark.demo_tickers(2)  # the daemon's night takes the snapshot's whole list
@pytest.mark.parametrize(("failing", "status", "level"), [
    (0, "succeeded", "info"), (1, "partial", "warning"), (2, "failed", "error")])
def test_the_daemon_logs_a_night_as_loud_as_the_timer_and_sends_its_digest(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, demo_dir: Path,
        failing: int, status: str, level: str) -> None:
    from app.runs.nightly import run_nightly
    from tests.unit.support.daemon_clock import NIGHT, batch_settings, daemon_for, running, tick

    tickers = demo_tickers(2)
    bad = set(tickers[:failing])
    fake_llm(monkeypatch, lambda chat: Reply(status=400, error="prompt rejected")
             if chat.ticker in bad else None, tickers)
    with webhook() as hook, structlog.testing.capture_logs() as logs, \
            running(daemon_for(sqlite_engine, run_nightly, notify=hook.url(),
                               **batch_settings(demo_dir)), NIGHT) as daemon:
        tick(daemon, NIGHT)
    [finished] = [e for e in logs if e["event"] == "nightly run finished"]
    assert (finished["status"], finished["log_level"]) == (status, level)
    [post] = hook.posts
    assert f"{status.upper()}, {2 - failing}/2 tickers" in post["title"]
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 1


# --- bad input and `nightdesk notify test` ----------------------------------------------------


@pytest.mark.parametrize("value", [
    "jsn://127.0.0.1/x",  # no such service
    "json://",  # no host
    "127.0.0.1:9000",  # no scheme
    "json://127.0.0.1:9000/x, slack://",  # the second lacks its tokens
])
@pytest.mark.parametrize("command", [["run", "--tickers", "AAPL"], ["notify", "test"],
                                     ["web", "--local-only"], ["batches"]])
def test_a_malformed_apprise_url_stops_any_command_at_start_in_one_line(
        sqlite_engine: Engine, value: str, command: list[str]) -> None:
    result = run_cli(*command, env={"NIGHTDESK_NOTIFY": value})
    assert result.code == 2
    [line] = result.error_lines
    assert line.startswith("error: invalid setting NIGHTDESK_NOTIFY: ")
    assert "destination" in line and "Traceback" not in result.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 0


def test_a_bad_url_is_named_by_position_never_echoed() -> None:
    result = run_cli("notify", "test",
                     env={"NIGHTDESK_NOTIFY": "json://h/x,slack://s3cr3t-token-only"})
    assert result.code == 2 and "s3cr3t" not in result.stderr
    assert "destination 2 of 2 (slack://)" in result.stderr


def test_notify_test_sends_to_every_destination() -> None:
    with webhook() as one, webhook() as two:
        result = run_cli("notify", "test",
                         env={"NIGHTDESK_NOTIFY": f"{one.url()}, {two.url('other')}"})
    assert result.code == 0, result.stderr
    assert [p["title"] for p in one.posts + two.posts] == ["nightdesk: test message"] * 2
    assert two.paths == ["/other"]
    assert "delivered to 2 of 2 destinations" in result.stderr


def test_notify_test_exits_1_when_a_destination_refuses() -> None:
    with webhook() as hook:
        result = run_cli("notify", "test", env={
            "NIGHTDESK_NOTIFY": f"{hook.url()},json://127.0.0.1:{closed_port()}/gone"})
    assert result.code == 1
    assert len(hook.posts) == 1
    assert result.stderr.splitlines()[-1] == ("error: test message delivered to 1 of 2 "
                                              "destinations")


def test_notify_test_without_destinations_is_an_input_error() -> None:
    result = run_cli("notify", "test")
    assert result.code == 2
    [line] = result.error_lines
    assert line.startswith("error: NIGHTDESK_NOTIFY is not set")


def test_destinations_from_a_toml_array(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    config = tmp_path / "nightdesk.toml"
    config.write_text('notify = ["json://127.0.0.1:9000/a", "ntfy://nightdesk"]\n')
    monkeypatch.setenv("NIGHTDESK_CONFIG", str(config))
    assert split_destinations(load_settings().notify.urls) == ["json://127.0.0.1:9000/a",
                                                          "ntfy://nightdesk"]
    config.write_text('notify = ["json://127.0.0.1:9000/a", "jsn://x"]\n')
    result = run_cli("notify", "test")
    assert result.code == 2 and "destination 2 of 2" in result.error_lines[0]


@pytest.mark.parametrize("value", ["desk.example.org", "ftp://desk.example.org", "https://"])
def test_a_web_base_url_that_is_no_http_url_is_one_line(value: str) -> None:
    result = run_cli("notify", "test", env={"NIGHTDESK_WEB_BASE_URL": value})
    assert result.code == 2
    [line] = result.error_lines
    assert line.startswith("error: invalid setting NIGHTDESK_WEB_BASE_URL: ")


@pytest.mark.parametrize(("rated", "top", "bottom"), [
    (3, "Top 3: 1. T00", None), (7, "Top 5: 1. T00", "Bottom 2: 6. T05"),
    (12, "Top 5: 1. T00", "Bottom 5: 8. T07")])
def test_the_two_ends_never_name_a_ticker_twice(sqlite_engine: Engine, rated: int, top: str,
                                                bottom: str | None) -> None:
    night = add_night(sqlite_engine, D1, at(D2, 0, 10),
                      {f"T{i:02d}": Rated("Hold", round(0.1 - 0.01 * i, 2))
                       for i in range(rated)})
    lines = build_digest(sqlite_engine, load_settings(), night).message.body.splitlines()
    [top_line] = [line for line in lines if line.startswith("Top ")]
    bottoms = [line for line in lines if line.startswith("Bottom ")]
    assert top_line.startswith(top)
    assert bottoms == [] if bottom is None else bottoms[0].startswith(bottom)
    named = [part.split(". ")[1].split()[0] for line in [top_line, *bottoms]
             for part in line.split(": ", 1)[1].split("; ")]
    assert len(named) == len(set(named)) == min(rated, 10)


@pytest.mark.parametrize("ending", ["succeeded", "failed", "interrupted"])
def test_a_reruns_digest_says_applied_only_when_the_ranking_applies_it(
        sqlite_engine: Engine, ending: str) -> None:
    # The ranking takes a rerun's rating only; a rerun that failed or was stopped leaves the
    # night's own result there, and its digest must not say otherwise.
    from app.morning.ranking import ranking

    night = add_night(sqlite_engine, D2, at(D2, 0, 10), {"T00": Rated("Buy", 0.9),
                                                         "T01": Rated(error="DataError: x")})
    rerun = add_night(sqlite_engine, D2, at(D2, 2, 10), {"T01": {
        "succeeded": Rated("Hold", 0.1), "failed": Rated(error="LLMTimeoutError: late"),
        "interrupted": Rated(status="interrupted")}[ending]}, kind="rerun",
        status=None if ending != "interrupted" else "interrupted")
    body = build_digest(sqlite_engine, load_settings(), rerun).message.body.splitlines()
    ranked = {row.ticker: row for row in ranking(sqlite_engine, night)[1]}
    applied = ranked["T01"].batch_id == rerun  # what the ranking itself did
    assert applied == (ending == "succeeded")
    expected = (f"Applied to the ranking of nightly batch #{night}" if applied else
                f"Not applied: the ranking of nightly batch #{night} keeps T01's earlier "
                "result")
    assert expected in body, body


def test_a_nights_digest_names_the_reruns_its_ranking_applies_as_the_ranking_does(
        sqlite_engine: Engine) -> None:
    # A night crashed; T01 was rerun; the night was resumed and finished after it. The
    # ranking and the page tag T01's row as rerun #N's; the digest's Top showed the rerun's
    # rating as the night's own.
    night = add_night(sqlite_engine, D2, at(D2, 0, 10), {"T00": Rated("Buy", 0.9),
                                                         "T01": Rated("Hold", 0.0)},
                      minutes=300)
    rerun = add_night(sqlite_engine, D2, at(D2, 2, 10), {"T01": Rated("Sell", -0.8)},
                      kind="rerun")
    said = run_cli("ranking", env={"COLUMNS": "200"}).stdout
    assert f"reruns applied: T01 from rerun #{rerun}" in said.splitlines()
    body = build_digest(sqlite_engine, load_settings(), night).message.body.splitlines()
    assert "Top 2: 1. T00 Buy +0.90; 2. T01 Sell -0.80" in body, body
    assert f"Reruns applied: T01 from rerun #{rerun}" in body, body


def test_a_rerun_of_a_ticker_its_night_did_not_have_is_not_said_applied(
        sqlite_engine: Engine) -> None:
    # The same date's night was of another universe (or --limit left the ticker out): the
    # ranking applies a rerun only where the night has a row, so this one is shown nowhere.
    from app.morning.ranking import ranking

    night = add_night(sqlite_engine, D2, at(D2, 0, 10), {"T00": Rated("Buy", 0.9),
                                                         "T01": Rated("Hold", 0.0)})
    rerun = add_night(sqlite_engine, D2, at(D2, 2, 10), {"T05": Rated("Sell", -0.8)},
                      kind="rerun")
    assert "T05" not in {row.ticker for row in ranking(sqlite_engine, night)[1]}
    body = build_digest(sqlite_engine, load_settings(), rerun).message.body.splitlines()
    assert f"Not applied: the ranking of nightly batch #{night} has no row for T05 (not in " \
           "its universe)" in body, body
    assert not any(line.startswith("Applied to") for line in body), body
