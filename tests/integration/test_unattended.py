"""Kill the LLM server and the batch process on cue, and check that the night still completes.

Both run as real processes: ``nightdesk run`` and tests/integration/faultserver.py, an
OpenAI-compatible server that logs every request it answered to the end (vLLM cannot be
killed and back within seconds: it takes minutes to start on a CPU). The server's log is
the independent record the batch's rows are held against.

Kills happen while the server *holds* new requests (they are at the server, unanswered) and
no answer is streaming: a request the server finished while the client died reading it would
be finished twice by any client, so the test does not stage that race.
"""

from __future__ import annotations

import itertools
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import demo_tickers
from app.db.engine import get_engine
from app.db.models import Batch, LLMCall, ServerSample, TickerRun
from app.morning.serverview import server_view
from app.runs.checkpoints import checkpoint_path
from tests.integration.unattended import (
    FaultServer,
    batch_env,
    fault_server,
    run_args,
    run_nightdesk,
    start_batch,
    wait_for,
)

TICKERS = 4
# The night runs the snapshot's universe: every ticker demo_dir (under ``night``) writes.
pytestmark = [pytest.mark.integration, pytest.mark.demo_tickers(TICKERS)]


def quiet_with_requests_held(server: FaultServer) -> None:
    """Hold new requests; return once some are held and none is streaming an answer."""
    server.hold(True)
    wait_for(lambda: (s := server.state())["held"] >= 1 and s["streaming"] == 0, 60,
             "requests held at the server and no answer streaming")


def database(folder: Path) -> Engine:
    return get_engine(f"sqlite:///{folder}/nightdesk.db")


def ok_request_ids(db: Engine) -> Counter[str]:
    with db.connect() as conn:
        return Counter(conn.execute(select(LLMCall.request_id)
                                    .where(LLMCall.status == "ok")).scalars())


def check_complete(db: Engine, server: FaultServer) -> dict[str, Any]:
    """Check what every test here needs; return the batch row."""
    with db.connect() as conn:
        batch = conn.execute(select(Batch.__table__)).one()
        runs = dict(conn.execute(select(TickerRun.ticker, TickerRun.status)).all())
        nodes = Counter(conn.execute(select(LLMCall.ticker, LLMCall.node)
                                     .where(LLMCall.status == "ok")).all())
    assert batch.status == "succeeded", batch.error
    assert runs == dict.fromkeys(demo_tickers(TICKERS), "succeeded")
    log = server.finished()
    # No finished request was repeated: each request the server answered, it answered once.
    repeated = [key for key, n in Counter(e["key"] for e in log).items() if n > 1]
    assert not repeated
    # llm_calls matches the server's own log one to one: every answer has its row, no more.
    assert ok_request_ids(db) == Counter(e["id"] for e in log)
    # 17 nodes per ticker, each answered once (a decision re-ask would be a second row).
    assert len(nodes) == TICKERS * 17 and set(nodes.values()) == {1}
    return dict(batch._mapping)


def test_llm_server_killed_and_back_20_s_later_every_ticker_succeeds(night: Path) -> None:
    with fault_server(night) as server:
        env = batch_env(night, server)
        batch = start_batch(night, env, *run_args(night))
        wait_for(lambda: len(server.finished()) >= 20, 180, "20 answered requests")
        quiet_with_requests_held(server)
        time.sleep(1.5)  # the batch reads /metrics once more after the last answer
        before = len(server.finished())
        server.kill()
        time.sleep(20)
        assert batch.poll() is None, "the batch gave up while the server was down"
        server.start()  # a new process: its counters start again from zero, as vLLM's do
        code = batch.wait(300)
        log_text = (night / "batch.log").read_text()
        assert code == 0, log_text[-3000:]
        db = database(night)
        row = check_complete(db, server)
    assert before < len(server.finished())  # the night went on after the restart
    assert len({e["boot"] for e in server.finished()}) == 2
    outages = row["settings"]["server_outages"]
    assert len(outages) == 1 and outages[0]["seconds"] >= 15
    with db.connect() as conn:
        cut = conn.execute(select(LLMCall.error_class, LLMCall.request_id)
                           .where(LLMCall.status == "error")).all()
        generated = [r.generation_tokens_total for r in conn.execute(
            select(ServerSample.generation_tokens_total).order_by(ServerSample.sampled_at))]
        completion = sum(conn.execute(select(LLMCall.completion_tokens)
                                      .where(LLMCall.status == "ok")).scalars())
    # The requests held when the server died failed once, as connection faults, and were
    # sent again; none of them was ever answered by the dead server.
    assert cut and {c.error_class for c in cut} <= {"connection", "stream"}
    assert not {c.request_id for c in cut} & {e["id"] for e in server.finished()}
    # The server's counters went back to zero at the restart, and the report's view of
    # the batch still adds up to every token the rows hold.
    assert any(b < a for a, b in itertools.pairwise(generated))
    assert server_view(db, row["id"]).generation_tokens == completion


def checkpoint_threads(folder: Path) -> int:
    with sqlite3.connect(checkpoint_path(f"sqlite:///{folder}/nightdesk.db")) as conn:
        return int(conn.execute("SELECT COUNT(DISTINCT thread_id) FROM checkpoints").fetchone()[0])


def test_batch_sigkilled_mid_run_resumes_without_calling_a_finished_node_again(
        night: Path) -> None:
    with fault_server(night) as server:
        env = batch_env(night, server)
        batch = start_batch(night, env, *run_args(night))
        wait_for(lambda: len(server.finished()) >= 25, 180, "25 answered requests")
        quiet_with_requests_held(server)
        time.sleep(1.0)  # every answered node is checkpointed (durability "sync")
        answered = {e["key"] for e in server.finished()}
        batch.send_signal(signal.SIGKILL)
        batch.wait(10)
        server.hold(False, drop=True)  # what was held belonged to the dead process
        db = database(night)
        with db.connect() as conn:
            assert conn.execute(select(Batch.status)).scalar_one() == "running"
            left = conn.execute(select(TickerRun.ticker)
                                .where(TickerRun.status != "succeeded")).scalars().all()
        assert left, "the kill came too late to leave work to resume"
        time.sleep(3.5)  # longer than NIGHTDESK_HEARTBEAT_STALE_S: the batch is taken for dead
        done = run_nightdesk(night, env, "run", "--resume", name="resume")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "marked crashed" in done.stderr and "resuming batch 1" in done.stderr
        check_complete(db, server)
        again = [e for e in server.finished() if e["key"] in answered]
    # No node answered before the kill was asked again by the resumed batch.
    assert len(again) == len(answered)
    assert checkpoint_threads(night) == 0


def test_sigterm_ends_the_batch_within_its_grace_as_interrupted_and_resume_completes(
        night: Path) -> None:
    grace = 4.0
    with fault_server(night) as server:
        env = batch_env(night, server, shutdown_grace_s=grace)
        batch = start_batch(night, env, *run_args(night))
        wait_for(lambda: len(server.finished()) >= 20, 180, "20 answered requests")
        # Requests held at the server cannot finish: the grace is what ends the wait.
        quiet_with_requests_held(server)
        answered = {e["key"] for e in server.finished()}
        started = time.monotonic()
        batch.send_signal(signal.SIGTERM)
        code = batch.wait(60)
        took = time.monotonic() - started
        log_text = (night / "batch.log").read_text()
        assert code == 130, log_text[-3000:]
        assert took < grace + 5, f"stopping took {took:.1f} s"
        assert "interrupted" in log_text.splitlines()[-1]  # one line says how it ended
        db = database(night)
        with db.connect() as conn:
            status, error = conn.execute(select(Batch.status, Batch.error)).one()
            runs = set(conn.execute(select(TickerRun.status)).scalars())
        assert status == "interrupted" and "SIGTERM" in (error or "")
        assert "running" not in runs and "queued" not in runs
        server.hold(False, drop=True)
        done = run_nightdesk(night, env, "run", "--resume", name="resume")
        assert done.returncode == 0, done.stderr[-3000:]
        check_complete(db, server)
        again = [e for e in server.finished() if e["key"] in answered]
    assert len(again) == len(answered)


def test_sigterm_lets_the_calls_at_the_server_finish_and_keeps_them(night: Path) -> None:
    with fault_server(night, chunk_delay_s=0.4) as server:  # ~1.6 s per answer
        env = batch_env(night, server, shutdown_grace_s=30)
        batch = start_batch(night, env, *run_args(night))
        wait_for(lambda: len(server.finished()) >= 12, 180, "12 answered requests")
        wait_for(lambda: server.state()["streaming"], 30, "answers streaming")
        started = time.monotonic()
        batch.send_signal(signal.SIGTERM)
        code = batch.wait(60)
        took = time.monotonic() - started
        assert code == 130
        assert took < 30, "it waited out the whole grace instead of the calls at the server"
        assert server.state()["streaming"] == 0
        db = database(night)
        with db.connect() as conn:
            cut = conn.execute(select(LLMCall.node, LLMCall.error)
                               .where(LLMCall.status == "error")).all()
        # What was at the server when the signal came was answered and kept, none was cut:
        # every answer has its ok row and there is no failed attempt at all.
        assert not cut
        assert ok_request_ids(db) == Counter(e["id"] for e in server.finished())
        done = run_nightdesk(night, env, "run", "--resume", name="resume")
        assert done.returncode == 0, done.stderr[-3000:]
        check_complete(database(night), server)
