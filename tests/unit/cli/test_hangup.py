"""A night started in a terminal that goes away (its window closed, the ssh session under it
dropped): the kernel sends SIGHUP to the session's leader and fails every later write to the
terminal with EIO. The night stops as SIGTERM stops it: calls at the server finish, every
answered call keeps its row, the batch is ``interrupted`` (exit 130), and the resume it
names finishes it. Before, SIGHUP killed the process outright (the batch left ``running``,
the rows of calls answered but not yet written lost); with SIGHUP caught, the first
progress line to the hung-up terminal (EIO) ended the batch ``crashed``, exit 1.

Real processes in a real pseudo-terminal; the server a fake on a free port of 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
import sys
import termios
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from agents.data.demo import DEMO_AS_OF, write_demo
from app.db.engine import get_engine
from app.db.models import Batch, TickerRun
from tests.dbfaults import check_rows_match
from tests.fakevllm import ChatRequest, FakeServer, Reply, default_reply
from tests.fakevllm.server import serving
from tests.unit.support.bursts import TICKERS
from tests.unit.support.fault_night import NODES, QUICK_ENV

ROOT = Path(__file__).resolve().parents[3]
NIGHTDESK = [sys.executable, "-c", "from app.cli import main; main()"]

pytestmark = pytest.mark.slow


def slowly(then: Callable[[ChatRequest], None]) -> Callable[[ChatRequest], Reply]:
    """Answer every request after 0.2 s (calls are at the server when the stop comes),
    having run ``then`` on it."""
    def script(chat: ChatRequest) -> Reply:
        then(chat)
        said = default_reply(chat)
        return Reply(said, delay_s=0.2) if isinstance(said, str) else said
    return script


@pytest.fixture
def served() -> Iterator[tuple[list[FakeServer], int]]:
    """A port on 127.0.0.1 answering as the first server of the list it yields."""
    current: list[FakeServer] = []
    ports: list[int] = []
    done, up = threading.Event(), threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await current[0].asgi()(scope, receive, send)

    async def serve() -> None:
        async with serving([app]) as bound:
            ports.extend(bound)
            up.set()
            await asyncio.to_thread(done.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert up.wait(30)
    try:
        yield current, ports[0]
    finally:
        done.set()
        thread.join(30)


def in_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``argv`` as the leader of a session whose controlling terminal is a new pty;
    return the process and the terminal's master (closing it hangs the terminal up)."""
    master, slave = os.openpty()

    def take_the_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=slave, stdout=slave,
                               stderr=slave, preexec_fn=take_the_terminal)
    os.close(slave)

    def drain() -> None:  # what the terminal shows, read so that no write of it blocks
        while True:
            try:
                if not os.read(master, 1 << 16):
                    return
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    return process, master


def test_a_night_whose_terminal_hangs_up_stops_resumable_and_keeps_every_row(
        tmp_path: Path, served: tuple[list[FakeServer], int]) -> None:
    current, port = served
    home = tmp_path / "home"
    write_demo(home / "data", DEMO_AS_OF, 3)
    terminal: list[int] = []

    def hang_up(chat: ChatRequest) -> None:
        if chat.index == 8 and terminal:
            os.close(terminal.pop())  # the terminal's window closed: SIGHUP, then EIO

    first = FakeServer(slowly(hang_up), nodes=NODES, tickers=TICKERS, model="smollm2-135m")
    current.append(first)
    env = {**os.environ, **QUICK_ENV, "PYTHONPATH": str(ROOT), "NIGHTDESK_HOME": str(home),
           "NIGHTDESK_LLM_BASE_URL": f"http://127.0.0.1:{port}/v1",
           "NIGHTDESK_SHUTDOWN_GRACE_S": "10"}
    env.pop("NIGHTDESK_DATABASE_URL", None)
    night, master = in_a_terminal(
        [*NIGHTDESK, "run", "--tickers", ",".join(TICKERS), "--as-of", str(DEMO_AS_OF),
         "--no-preflight"], env)
    terminal.append(master)
    try:
        code = night.wait(timeout=240)
    finally:
        if terminal:
            os.close(terminal.pop())
    db = get_engine(f"sqlite:///{home}/nightdesk.db")
    try:
        with db.connect() as conn:
            status, error = conn.execute(select(Batch.status, Batch.error)).one()
            done = conn.execute(select(func.count()).select_from(TickerRun).where(
                TickerRun.status.in_(("succeeded", "failed")))).scalar_one()
        assert (code, status) == (130, "interrupted"), (code, status, error)
        kept = ": finished tickers are kept" if done else " before any ticker finished"
        assert error == f"stopped by SIGHUP{kept}; resume with `nightdesk run --resume 1`"
        check_rows_match(db, first)  # every answered call has its row
        second = FakeServer(slowly(lambda _: None), nodes=NODES, tickers=TICKERS,
                            model="smollm2-135m")
        current[0] = second
        resumed = subprocess.run([*NIGHTDESK, "run", "--resume", "1", "--no-preflight"],
                                 cwd=ROOT, env=env, capture_output=True, text=True,
                                 timeout=240)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        check_rows_match(db, first, second)
    finally:
        db.dispose()
