"""Who owns a night: the batch just killed is the one resumed, and a live one is never taken.

Real processes (``nightdesk run`` and tests/integration/faultserver.py), as in
test_unattended.py. Two faults of ownership:

- kill -9, then ``run --resume`` with no id, at once: the nightly lock (free, its holder dead)
  decides, not the heartbeat's clock; the batch just killed is the newest and is the one
  continued, even with an older interrupted batch waiting.
- a PostgreSQL restart (a private cluster, tests/integration/pgcluster.py) lets go of every
  advisory lock, the live night's included: a second start must still be refused, the live
  run takes its lock again, and no request is sent twice.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.batch import store
from app.db.batchsettings import BatchSettings
from app.db.engine import get_engine, upgrade
from app.db.models import Batch, LLMCall, TickerRun
from tests.integration.pgcluster import private_cluster
from tests.integration.unattended import (
    FaultServer,
    batch_env,
    fault_server,
    run_args,
    run_nightdesk,
    start_batch,
    wait_for,
)

TICKERS = 3
# The night runs the snapshot's universe: every ticker demo_dir (under ``night``) writes.
pytestmark = [pytest.mark.integration, pytest.mark.demo_tickers(TICKERS)]


def answered_once(server: FaultServer) -> None:
    """Each request the server answered, it answered once."""
    repeated = [key for key, n in Counter(e["key"] for e in server.finished()).items() if n > 1]
    assert not repeated, f"{len(repeated)} requests were answered twice"


def ok_nodes(db: Engine, batch_id: int) -> Counter[tuple[str, str]]:
    with db.connect() as conn:
        return Counter(conn.execute(select(LLMCall.ticker, LLMCall.node)
                                    .where(LLMCall.batch_id == batch_id,
                                           LLMCall.status == "ok")).all())


def test_kill_9_then_resume_without_an_id_continues_that_batch_at_once(night: Path) -> None:
    db_url = f"sqlite:///{night}/nightdesk.db"
    upgrade(db_url)
    db = get_engine(db_url)
    # An older night, interrupted with a ticker left: the newest batch must still win.
    older = store.create_batch(db, kind="nightly", as_of=DEMO_AS_OF,
                               tickers=demo_tickers(1), samples=1,
                               settings=BatchSettings(samples=1, strategy="adaptive"),
                               server_facts=None)
    store.finish_batch(db, older, "interrupted", "interrupted by the operator")
    with fault_server(night) as server:
        # A heartbeat taken for dead only after 10 minutes: the resume must not wait for it.
        env = batch_env(night, server, heartbeat_stale_s=600, heartbeat_interval_s=1)
        batch = start_batch(night, env, *run_args(night))
        wait_for(lambda: len(server.finished()) >= 12, 180, "12 answered requests")
        server.hold(True)
        wait_for(lambda: server.state()["streaming"] == 0, 60, "no answer streaming")
        time.sleep(0.5)  # every answered node is checkpointed (durability "sync")
        batch.send_signal(signal.SIGKILL)
        batch.wait(10)
        server.hold(False, drop=True)  # what was held belonged to the dead process
        with db.connect() as conn:
            killed, status = conn.execute(select(Batch.id, Batch.status)
                                          .order_by(Batch.id.desc()).limit(1)).one()
        assert killed != older and status == "running"
        started = time.monotonic()
        done = run_nightdesk(night, env, "run", "--resume", name="resume")
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"resuming batch {killed} (nightly, crashed" in done.stderr
        with db.connect() as conn:
            statuses = dict(conn.execute(select(Batch.id, Batch.status)).all())
            runs = set(conn.execute(select(TickerRun.status)
                                    .where(TickerRun.batch_id == killed)).scalars())
        assert statuses == {older: "interrupted", killed: "succeeded"}
        assert runs == {"succeeded"}
        answered_once(server)
        nodes = ok_nodes(db, killed)
        assert len(nodes) == TICKERS * 17 and set(nodes.values()) == {1}
    assert time.monotonic() - started < 120


def test_resume_while_a_night_runs_is_refused_with_exit_4(night: Path) -> None:
    with fault_server(night, chunk_delay_s=0.2) as server:
        env = batch_env(night, server)
        batch = start_batch(night, env, *run_args(night))
        try:
            wait_for(lambda: len(server.finished()) >= 2, 180, "2 answered requests")
            refused = run_nightdesk(night, env, "run", "--resume", name="refused")
            assert refused.returncode == 4, refused.stderr[-2000:]
            assert refused.stderr.strip().splitlines() == ["error: already running: batch 1"]
        finally:
            batch.send_signal(signal.SIGKILL)
            batch.wait(10)


def test_postgres_restart_mid_night_a_second_start_is_refused_and_nothing_runs_twice(
        night: Path) -> None:
    with private_cluster() as cluster, fault_server(night) as server:
        upgrade(cluster.url)
        env = batch_env(night, server, database_url=cluster.url, heartbeat_interval_s=1,
                        heartbeat_stale_s=8)
        first = start_batch(night, env, *run_args(night), name="first")
        wait_for(lambda: len(server.finished()) >= 10, 180, "10 answered requests")
        # New requests wait at the server: the night is surely still on during the starts.
        server.hold(True)
        cluster.restart()  # every backend ends: the advisory lock is let go
        # What the timer runs, right after the restart and again once the run has had a
        # heartbeat to take its lock back: refused each time, nothing written.
        for attempt in range(3):
            second = run_nightdesk(night, env, "run", "--continue-night", *run_args(night)[1:],
                                   name=f"second-{attempt}")
            assert second.returncode == 4, second.stderr[-3000:]
            assert "already running: batch 1" in second.stderr
            assert first.poll() is None
            time.sleep(1.5)
        server.hold(False)
        assert first.wait(300) == 0, (night / "first.log").read_text()[-3000:]
        db = get_engine(cluster.url)
        try:
            with db.connect() as conn:
                batches = conn.execute(select(Batch.id, Batch.status, Batch.settings)).all()
            assert [(b.id, b.status) for b in batches] == [(1, "succeeded")]
            assert "resumes" not in (batches[0].settings or {})  # never taken over
            answered_once(server)
            nodes = ok_nodes(db, 1)
            assert len(nodes) == TICKERS * 17 and set(nodes.values()) == {1}
            log_text = (night / "first.log").read_text()
            assert "nightly lock taken again" in log_text
        finally:
            db.dispose()
