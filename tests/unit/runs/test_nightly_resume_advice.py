"""The advice a stopped night gives names the command that continues it, and that command
works: a night stopped by an HTTP 404 (the model gone from the server), resumed with the
real CLI on SQLite against the fake server."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from app.db.batchsettings import BatchSettings
from app.db.models import Batch, TickerRun
from app.errors import InputError
from tests.fakevllm import FakeServer
from tests.fakevllm.chat import ChatRequest, Reply
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import NODES, serve_cli_from
from tests.webhook import webhook


def model_gone_after(answers: int) -> object:
    """A server script: ``answers`` chat answers, then 404 as a server that no longer serves
    the model says."""
    seen = [0]

    def script(chat: ChatRequest) -> Reply | None:
        seen[0] += 1
        if seen[0] > answers:
            return Reply(status=404, error="The model `fake-model` does not exist.")
        return None

    return script


def test_a_night_stopped_by_a_404_names_its_resume_and_the_resume_finishes_it(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tickers = demo_tickers(3)
    first = FakeServer(model_gone_after(20), nodes=NODES, tickers=tickers)
    serve_cli_from(monkeypatch, first, demo_dir)
    stopped = run_cli("run", "--tickers", ",".join(tickers), "--no-preflight")
    assert stopped.code == 2, stopped.stderr
    said = stopped.error_lines[-1]
    assert said.startswith("error: batch 1 failed: "), stopped.stderr
    assert "does not exist" in said and "`nightdesk run --resume 1`" in said, said
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "failed"
        assert "interrupted" in set(conn.execute(select(TickerRun.status)).scalars())

    # The advised command, once the server serves the model again, finishes the night.
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=tickers), demo_dir)
    resumed = run_cli("run", "--resume", "1", "--no-preflight")
    assert resumed.code == 0, resumed.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "succeeded"


def stopped_night(monkeypatch: pytest.MonkeyPatch, demo_dir: Path, answers: int) -> None:
    """Run a night of three tickers with the real CLI that stops on a 404 after ``answers``."""
    tickers = demo_tickers(3)
    serve_cli_from(monkeypatch, FakeServer(model_gone_after(answers), nodes=NODES,
                                           tickers=tickers), demo_dir)
    stopped = run_cli("run", "--tickers", ",".join(tickers), "--no-preflight")
    assert stopped.code == 2 and "HTTP 404" in stopped.stderr, stopped.stderr


def test_a_resume_under_another_model_is_refused_naming_both_and_the_ways_out(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    stopped_night(monkeypatch, demo_dir, 20)
    second = FakeServer(nodes=NODES, tickers=demo_tickers(3), model="other-model")
    serve_cli_from(monkeypatch, second, demo_dir)
    refused = run_cli("run", "--resume", "1", "--no-preflight",
                      env={"NIGHTDESK_LLM_MODEL": "other-model"})
    assert refused.code == 2, refused.stderr
    assert refused.error_lines == [
        "error: batch 1 ran with model 'smollm2-135m' (20 answers), and NIGHTDESK_LLM_MODEL "
        "is now 'other-model': a resume would mix the two in one night; continue it with "
        f"NIGHTDESK_LLM_MODEL=smollm2-135m, or analyze {DEMO_AS_OF} anew under "
        f"'other-model': `nightdesk run --as-of {DEMO_AS_OF}`"], refused.stderr
    # Nothing asked of the server, nothing of the batch changed.
    assert second.chats == []
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "failed"
    # Both ways out work: the batch under its own model, the date anew under the other.
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=demo_tickers(3)), demo_dir)
    assert run_cli("run", "--resume", "1", "--no-preflight").code == 0
    serve_cli_from(monkeypatch, second, demo_dir)
    anew = run_cli("run", "--as-of", str(DEMO_AS_OF), "--no-preflight",
                   env={"NIGHTDESK_LLM_MODEL": "other-model"})
    assert anew.code == 0, anew.stderr
    with sqlite_engine.connect() as conn:
        assert [(b.status, b.settings["model"]) for b in conn.execute(
            select(Batch.status, Batch.settings).order_by(Batch.id))] == [
            ("succeeded", "smollm2-135m"), ("succeeded", "other-model")]


def test_a_batch_without_answers_resumes_under_the_model_fixed_and_records_it(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A wrong model name from the start: nothing was answered, so nothing would be mixed.
    stopped_night(monkeypatch, demo_dir, 0)
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=demo_tickers(3),
                                           model="other-model"), demo_dir)
    resumed = run_cli("run", "--resume", "1", "--no-preflight",
                      env={"NIGHTDESK_LLM_MODEL": "other-model"})
    assert resumed.code == 0, resumed.stderr
    with sqlite_engine.connect() as conn:
        status, settings = conn.execute(select(Batch.status, Batch.settings)).one()
    assert (status, settings["model"]) == ("succeeded", "other-model")


def test_a_resume_keeps_the_batchs_own_sampling_and_says_so(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    stopped_night(monkeypatch, demo_dir, 20)
    second = FakeServer(nodes=NODES, tickers=demo_tickers(3))
    serve_cli_from(monkeypatch, second, demo_dir)
    resumed = run_cli("run", "--resume", "1", "--no-preflight",
                      env={"NIGHTDESK_TEMPERATURE": "0.1"})
    assert resumed.code == 0, resumed.stderr
    assert {chat.body["temperature"] for chat in second.chats} == {0.7}
    assert "keeps its own setting" in resumed.stderr and "NIGHTDESK_TEMPERATURE" in \
        resumed.stderr, resumed.stderr


def test_the_timers_continue_night_under_another_model_is_refused_with_a_digest(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The timer's path: the night of the snapshot's date stopped, then fired again under
    # another model; refused in one line, and the morning digest says so.
    serve_cli_from(monkeypatch, FakeServer(model_gone_after(20), nodes=NODES,
                                           tickers=demo_tickers(3)), demo_dir)
    assert run_cli("run", "--as-of", str(DEMO_AS_OF), "--no-preflight").code == 2
    second = FakeServer(nodes=NODES, tickers=demo_tickers(3), model="other-model")
    serve_cli_from(monkeypatch, second, demo_dir)
    with webhook() as hook:
        refused = run_cli("run", "--continue-night", "--no-preflight",
                          env={"NIGHTDESK_LLM_MODEL": "other-model",
                               "NIGHTDESK_NOTIFY": hook.url()})
    assert refused.code == 2, refused.stderr
    [line] = [said for said in refused.error_lines if said.startswith("error: ")]
    assert line.startswith("error: batch 1 ran with model 'smollm2-135m' (20 answers)"), line
    assert second.chats == []
    [post] = hook.posts
    assert "REFUSED at its start" in post["title"]
    assert post["message"].splitlines()[0] == f"Why: {line.removeprefix('error: ')}"


def test_only_a_resume_that_would_ask_more_is_refused_for_another_model() -> None:
    from app.config import load_settings
    from app.runs.resumable import ResumePoint

    def point(tickers: list[str], answered: int) -> ResumePoint:
        return ResumePoint(7, "nightly", DEMO_AS_OF, None,
                           BatchSettings(model="a", samples=1),
                           tickers, 2, "crashed", answered=answered)

    other = load_settings(llm_model="b")
    with pytest.raises(InputError, match="batch 7 ran with model 'a' \\(5 answers\\)"):
        point(["X"], 5).shaped(other)
    # No answers yet: nothing to mix. No tickers left: the resume only writes its end.
    assert point(["X"], 0).shaped(other).llm.model == "b"
    assert point([], 5).shaped(other).llm.model == "b"


@pytest.mark.parametrize(("given", "env", "options", "count"), [
    # A subset of the universe: named.
    (["--tickers", "{2},{0},{4}"], {}, "--tickers {2},{0},{4}", 3),
    # The universe's first N: --limit N, as the batch was started.
    (["--limit", "2"], {}, "--limit 2", 2),
    # The whole universe, and NIGHTDESK_SAMPLES set since: the batch's own samples given.
    ([], {"NIGHTDESK_SAMPLES": "2"}, "--samples 1", 5),
], ids=["tickers", "limit", "samples"])
def test_the_refusals_analyze_anew_takes_the_batchs_own_tickers_and_samples(
        cli_env: None, sqlite_engine: Engine, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, given: list[str], env: dict[str, str],
        options: str, count: int) -> None:
    import shlex

    # A universe of five; the batch ran on some of them.
    universe = demo_tickers(5)
    data = tmp_path / "data5"
    write_demo(data, DEMO_AS_OF, 5)
    monkeypatch.setenv("NIGHTDESK_DATA_DIR", str(data))
    given = [arg.format(*universe) for arg in given]
    options = options.format(*universe)
    serve_cli_from(monkeypatch, FakeServer(model_gone_after(20), nodes=NODES,
                                           tickers=universe), data)
    stopped = run_cli("run", "--as-of", str(DEMO_AS_OF), *given, "--no-preflight")
    assert stopped.code == 2 and "HTTP 404" in stopped.stderr, stopped.stderr

    other = {"NIGHTDESK_LLM_MODEL": "other-model", **env}
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=universe, model="other-model"),
                   data)
    refused = run_cli("run", "--resume", "1", "--no-preflight", env=other)
    assert refused.code == 2, refused.stderr
    advised = refused.error_lines[-1].rsplit("`", 2)[-2]
    assert advised == f"nightdesk run --as-of {DEMO_AS_OF} {options}", refused.stderr

    # The advised command, as given, analyzes the batch's own tickers with its samples.
    anew = run_cli(*shlex.split(advised)[1:], "--no-preflight", env=other)
    assert anew.code == 0, anew.stderr
    with sqlite_engine.connect() as conn:
        nights = {batch: (sorted(conn.execute(select(TickerRun.ticker).where(
            TickerRun.batch_id == batch)).scalars()), settings["samples"])
            for batch, settings in conn.execute(select(Batch.id, Batch.settings))}
    assert len(nights[1][0]) == count and nights[2] == nights[1], nights


def test_a_rerun_left_running_by_a_process_gone_resumes_at_once_as_advised(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What a rerun whose end the database would not take leaves (StorageOutage: "...;
    # resume with `nightdesk run --resume N`"): its row running, its heartbeat fresh, its
    # process gone. A rerun takes no lock; its recorded process decides, as a night's does.
    import socket
    import subprocess

    from app.batch import store

    gone = subprocess.Popen(["true"])
    gone.wait()
    ticker = demo_tickers(3)[0]
    rerun = store.create_batch(
        sqlite_engine, kind="rerun", as_of=DEMO_AS_OF, tickers=[ticker], samples=1,
        settings=BatchSettings.read({
            "samples": 1, "strategy": "adaptive",
            "runner": {"host": socket.gethostname(), "pid": gone.pid, "started": None}}),
        server_facts=None)
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=[ticker]), demo_dir)
    resumed = run_cli("run", "--resume", str(rerun), "--no-preflight")
    assert resumed.code == 0, resumed.stderr
    assert f"resuming batch {rerun} (rerun, crashed, " in resumed.stderr, resumed.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "succeeded"


def test_a_night_whose_end_the_full_disk_refused_pushes_a_digest_and_its_resume_works(
        cli_env: None, sqlite_engine: Engine, demo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The disk full as the night ends: its row stays `running`, the CLI's line advises the
    # resume (exit 2). Before: no digest at all, on a night that never got its end.
    import sqlite3
    import subprocess
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from app.batch import store

    def full(*_args: object, **_kwargs: object) -> None:
        error = sqlite3.OperationalError("database or disk is full")
        error.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
        raise error

    tickers = demo_tickers(2)
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=tickers), demo_dir)
    with monkeypatch.context() as patch, webhook() as hook:
        patch.setattr(store, "finish_batch", full)
        stopped = run_cli("run", "--tickers", ",".join(tickers), "--no-preflight",
                          env={"NIGHTDESK_NOTIFY": hook.url()})
    assert stopped.code == 2 and "database or disk is full" in stopped.stderr, stopped.stderr
    [post] = hook.posts
    assert post["title"] == (f"DEMO DATA — nightdesk: nightly batch #1 (as of {DEMO_AS_OF}) "
                             "STOPPED, its end not stored")  # a demo batch, as its digest
    lines = post["message"].splitlines()
    assert lines[0].startswith("Why: the batch's end not stored") and "full" in lines[0]
    command = lines[1].split(": ")[-1]
    assert command == "nightdesk run --resume 1", lines
    # By the morning the CLI's process has exited (here the test's own lives on) and its
    # heartbeat is old.
    gone = subprocess.Popen(["true"])
    gone.wait()
    with sqlite_engine.begin() as conn:
        settings = conn.execute(select(Batch.settings)).scalar_one()
        conn.execute(update(Batch).values(settings={
            **settings, "runner": {**settings["runner"], "pid": gone.pid}},
            heartbeat_at=datetime.now(UTC) - timedelta(minutes=10)))
    # Every ticker had finished: the morning advises the resume that writes the end, which
    # `run --resume` refused before ("has no tickers left to run", exit 2).
    said = run_cli("report", "1").stdout
    assert "next: nightdesk run --resume 1 (writes the end it lacks: every ticker finished)" \
        in said, said
    resumed = run_cli(*command.split()[1:], "--no-preflight")
    assert resumed.code == 0, resumed.stderr
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(Batch.status)).scalar_one() == "succeeded"
