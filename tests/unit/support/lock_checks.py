"""The batch lock's checks, run on SQLite by the unit tests and on PostgreSQL by the
integration tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.config import Settings
from app.db.lock import nightly_lock
from app.db.models import Batch, LLMCall
from app.errors import AlreadyRunningError
from app.runs.nightly import NightlyRequest, run_nightly
from tests.fakevllm import ChatRequest, Reply
from tests.unit.support.engines import fake_llm

NIGHTDESK = Path(sys.executable).with_name("nightdesk")


def check_race(engine: Engine) -> None:
    outcomes = race(engine, 3)
    assert len(outcomes) == 3 and outcomes.count("entered") == 1, outcomes
    refused = [o for o in outcomes if o != "entered"]
    assert all(isinstance(e, AlreadyRunningError) and e.exit_code == 4 for e in refused)
    # Let go afterwards: the next night takes it again.
    with nightly_lock(engine):
        pass


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
