"""Check the nightly single-instance lock: one nightly run at a time, across threads and processes.

The helpers here take an engine, so tests/integration/test_lock_postgres.py runs the same
checks against PostgreSQL's advisory lock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from typer.testing import CliRunner

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.graph import node_names
from app.batch import store
from app.batch.engine import BatchEngine
from app.cli import app as cli
from app.config import Settings, load_settings
from app.db.lock import lock_file_path, nightly_lock
from app.db.models import Batch, LLMCall
from app.errors import AlreadyRunningError
from app.runs.nightly import NightlyRequest, run_nightly
from tests.fakevllm import ChatRequest, FakeServer, Reply, Script

NIGHTDESK = Path(sys.executable).with_name("nightdesk")


@pytest.fixture
def demo_dir(tmp_path: Path) -> Path:
    write_demo(tmp_path / "data", DEMO_AS_OF, 3)
    return tmp_path / "data"


def fake_llm(monkeypatch: pytest.MonkeyPatch, script: Script | None = None,
             tickers: list[str] | None = None) -> FakeServer:
    """Point every BatchEngine, and the preflight's /v1/models, at a fake server serving the
    settings' model (no /metrics sampling, no network for facts)."""
    settings = load_settings()
    server = FakeServer(script, nodes=node_names(settings), tickers=tickers or [],
                        model=settings.llm_model)
    original = BatchEngine.__init__

    def with_fake(self: BatchEngine, *args: object, **kwargs: object) -> None:
        kwargs.update(http_client=server.client(), sample_metrics=False)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(BatchEngine, "__init__", with_fake)
    monkeypatch.setattr("app.runs.nightly.batch_server_facts", lambda *_: {})
    monkeypatch.setattr("serving.preflight.httpx.Client", lambda **_: server.sync_client())
    return server


def batch_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Batch)).scalar_one())


def race(engine: Engine, contenders: int) -> list[str | BaseException]:
    """Start ``contenders`` threads taking the lock at the same instant; return what each got."""
    barrier = threading.Barrier(contenders)
    guard = threading.Lock()
    outcomes: list[str | BaseException] = []
    all_tried = threading.Event()

    def record(outcome: str | BaseException) -> None:
        with guard:
            outcomes.append(outcome)
            if len(outcomes) == contenders:
                all_tried.set()

    def contender() -> None:
        barrier.wait()
        try:
            with nightly_lock(engine):
                record("entered")
                all_tried.wait(20)  # hold it until every other contender has tried
        except BaseException as error:
            record(error)

    threads = [threading.Thread(target=contender) for _ in range(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcomes


def check_race(engine: Engine) -> None:
    outcomes = race(engine, 3)
    assert len(outcomes) == 3 and outcomes.count("entered") == 1, outcomes
    refused = [o for o in outcomes if o != "entered"]
    assert all(isinstance(e, AlreadyRunningError) and e.exit_code == 4 for e in refused)
    # Let go afterwards: the next night takes it again.
    with nightly_lock(engine):
        pass


def hold_in_subprocess(url: str) -> subprocess.Popen[str]:
    """Start another process that takes the lock and keeps it; return once it holds it."""
    code = ("import sys, time\n"
            "from app.db.engine import make_engine\n"
            "from app.db.lock import nightly_lock\n"
            f"with nightly_lock(make_engine({url!r})):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[3])
    assert holder.stdout is not None
    for line in holder.stdout:  # unconfigured structlog logs to stdout first
        if line.strip() == "held":
            return holder
    raise AssertionError(f"the holder exited with {holder.wait()} before taking the lock")


def check_lock_dies_with_its_holder(engine: Engine) -> None:
    url = engine.url.render_as_string(hide_password=False)
    holder = hold_in_subprocess(url)
    try:
        with pytest.raises(AlreadyRunningError), nightly_lock(engine):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: no cleanup code runs
        holder.wait(10)
    with nightly_lock(engine):  # the OS (or PostgreSQL) let go of the dead holder's lock
        pass


def check_second_start_during_a_batch(monkeypatch: pytest.MonkeyPatch, engine: Engine,
                                      settings: Settings) -> None:
    """Run a night; while its first LLM call is in flight, start another: it must be refused."""
    tickers = demo_tickers(2)
    request = NightlyRequest(as_of=DEMO_AS_OF, tickers=",".join(tickers))
    second: list[BaseException | str] = []

    def script(chat: ChatRequest) -> Reply | None:
        if not second:
            def start_again() -> None:
                try:
                    run_nightly(settings, request, engine=engine)
                    second.append("ran")
                except BaseException as error:
                    second.append(error)

            worker = threading.Thread(target=start_again)
            worker.start()
            worker.join(60)
        return None

    server = fake_llm(monkeypatch, script, tickers)
    night = run_nightly(settings, request, engine=engine)
    with engine.connect() as conn:
        batch_ids = conn.execute(select(Batch.id)).scalars().all()
        calls = conn.execute(select(func.count()).select_from(LLMCall)).scalar()
    assert len(batch_ids) == 1  # the second start wrote no batch row
    assert night.outcome is not None and night.outcome.status == "succeeded"
    assert len(second) == 1 and isinstance(second[0], AlreadyRunningError), second
    assert str(second[0]) == f"already running: batch {batch_ids[0]}"
    # Every call the server saw belongs to the one batch: 17 per ticker, none from the second.
    assert len(server.chats) == calls == 17 * len(tickers)


def test_three_starts_at_once_one_gets_the_lock(sqlite_engine: Engine) -> None:
    check_race(sqlite_engine)


def test_lock_file_sits_beside_the_database(sqlite_url: str) -> None:
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    assert lock_file_path(sqlite_url) == database.with_name(database.name + ".nightly.lock")


def test_a_crashed_holder_leaves_no_stale_lock(sqlite_engine: Engine) -> None:
    check_lock_dies_with_its_holder(sqlite_engine)


def test_second_start_during_a_batch_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                sqlite_engine: Engine, demo_dir: Path) -> None:
    settings = load_settings(check_context_length=False, retry_backoff_s=0, data_dir=demo_dir)
    check_second_start_during_a_batch(monkeypatch, sqlite_engine, settings)


@pytest.mark.slow
def test_cli_run_exits_4_with_one_line_while_another_process_holds_the_lock(
        sqlite_engine: Engine, sqlite_url: str, tmp_path: Path) -> None:
    running = store.create_batch(sqlite_engine, kind="nightly", as_of=date(2026, 11, 27),
                                 tickers=["AAA"], samples=1, settings={}, server_facts=None)
    env = {**os.environ, "NIGHTDESK_DATABASE_URL": sqlite_url,
           # Nothing listens here: had the run got past the lock, its ticker would fail
           # and write rows, which the counts below would show.
           "NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1", "NIGHTDESK_LOG_FORMAT": "json"}
    with nightly_lock(sqlite_engine):  # another process's flock: a separate open file
        result = subprocess.run([str(NIGHTDESK), "run", "--tickers", "AAA,BBB",
                                 "--as-of", "2026-11-27"], env=env, capture_output=True,
                                text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 4, result.stderr
    assert result.stderr.strip().splitlines() == [f"error: already running: batch {running}"]
    assert batch_count(sqlite_engine) == 1
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(LLMCall)).scalar() == 0


def test_rerun_does_not_take_the_nightly_lock(monkeypatch: pytest.MonkeyPatch,
                                              sqlite_engine: Engine, demo_dir: Path) -> None:
    ticker = demo_tickers(1)[0]
    server = fake_llm(monkeypatch, tickers=[ticker])
    monkeypatch.setenv("NIGHTDESK_CHECK_CONTEXT_LENGTH", "false")
    with nightly_lock(sqlite_engine):
        result = CliRunner().invoke(cli, ["rerun", ticker, "--no-preflight"])
    assert result.exit_code == 0, result.output
    with sqlite_engine.connect() as conn:
        kinds = conn.execute(select(Batch.kind, Batch.status)).all()
    assert [tuple(k) for k in kinds] == [("rerun", "succeeded")]
    assert len(server.chats) == 17
