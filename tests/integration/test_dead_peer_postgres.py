"""A PostgreSQL server whose host is gone mid-statement (powered off, the network cut: no
reset ever comes) is found dead within DEAD_PEER_S on every connection nightdesk makes: the
engines', the nightly lock's, the migrations' and the checkpoint pool's. Before, each waited
for its answer as long as the kernel's defaults allow (2 h idle before the first keepalive
probe). The cut is real: the client runs in a network namespace of its own, reaching the
server through a veth pair whose link the test sets down (root is needed, as CI has)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from app.runs.checkpoints import open_checkpointer
from tests.dbfaults import TcpProxy
from tests.integration.conftest import private_database

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEAD_PEER_S = 30  # app.db.engine.DEAD_PEER_S, written out: the test runs on code before it too
# Each path starts a statement that would run 10 minutes, then the link goes down.
CLIENT = """
import asyncio, json, sys
from sqlalchemy import text
from app.db.engine import get_engine, migration_engine
from app.db.lock import nightly_lock
from app.runs.checkpoints import open_checkpointer
from tests.dbfaults import timed_apart

url, took = sys.argv[1], {}
SLEEP = "SELECT pg_sleep(600)"

async def checkpoint_pool():
    async with open_checkpointer(url, statement_timeout_s=900) as saver:
        async with saver.conn.connection() as conn:
            await conn.execute(SLEEP)

engine = get_engine(url, 900)
with engine.connect() as a, migration_engine(url, 900).connect() as b, \\
        nightly_lock(engine, 900) as hold:
    runs = {"engine": lambda: a.execute(text(SLEEP)),
            "migrations": lambda: b.execute(text(SLEEP)),
            "nightly lock": lambda: hold._conn.execute(text(SLEEP)),
            "checkpoint pool": lambda: asyncio.run(checkpoint_pool())}
    for thread in timed_apart(runs, took):
        thread.join()
    print(json.dumps(took), flush=True)
    import os; os._exit(0)  # the lock's release would wait on the dead link too
"""


class Partition:
    """A network namespace joined to this one by a veth pair (10.213.N.1 here, .2 there);
    ``cut`` sets the link down: packets go nowhere and no reset comes back."""

    def __init__(self) -> None:
        self.ns = f"nd{uuid.uuid4().hex[:8]}"
        self.here = f"{self.ns}h"
        n = int(self.ns[2:4], 16)
        self.address = f"10.213.{n}.1"
        for cmd in (f"ip netns add {self.ns}",
                    f"ip link add {self.here} type veth peer name {self.ns}p",
                    f"ip link set {self.ns}p netns {self.ns}",
                    f"ip addr add {self.address}/30 dev {self.here}",
                    f"ip link set {self.here} up",
                    f"ip netns exec {self.ns} ip addr add 10.213.{n}.2/30 dev {self.ns}p",
                    f"ip netns exec {self.ns} ip link set {self.ns}p up"):
            subprocess.run(cmd.split(), check=True, capture_output=True, timeout=30)

    def cut(self) -> None:
        subprocess.run(["ip", "link", "set", self.here, "down"], check=True, timeout=30)

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.here], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)


async def make_checkpoint_tables(url: str) -> None:
    async with open_checkpointer(url):
        pass


def in_flight(url: str, count: int) -> None:
    """Wait until ``count`` sessions of ``url``'s database run the client's statement."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        for _ in range(600):
            running = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE state = "
                                   "'active' AND query = 'SELECT pg_sleep(600)' AND "
                                   "datname = current_database()").fetchone()
            if running and running[0] == count:
                return
            time.sleep(0.1)
    pytest.fail(f"the client's {count} statements never all ran")


@pytest.fixture
def partition() -> Iterator[Partition]:
    if os.geteuid() != 0:
        pytest.fail("the dead-peer test makes a network namespace: run it as root (CI does)")
    made = Partition()
    try:
        yield made
    finally:
        made.remove()


def test_every_connection_finds_a_dead_server_within_the_bound(partition: Partition) -> None:
    with private_database(f"nightdesk_dead_peer_{os.getpid()}") as url:
        # The saver's tables made first: its setup's CREATE INDEX CONCURRENTLY would wait
        # for the client's other statements, in transactions, to end.
        asyncio.run(make_checkpoint_tables(url))
        proxy = TcpProxy(("127.0.0.1", 5432), host=partition.address)
        try:
            through = make_url(url).set(host=partition.address, port=proxy.port)
            client = subprocess.Popen(
                ["ip", "netns", "exec", partition.ns, sys.executable, "-c", CLIENT,
                 through.render_as_string(hide_password=False)],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            in_flight(url, 4)  # each path's statement sent, and the server on it
            partition.cut()
            try:
                out, err = client.communicate(timeout=DEAD_PEER_S * 3)
            except subprocess.TimeoutExpired:
                client.kill()
                out, err = client.communicate()
                pytest.fail(f"a connection still waited {DEAD_PEER_S * 3} s after the cut")
            took = json.loads(out.strip().splitlines()[-1])
            assert set(took) == {"engine", "migrations", "nightly lock", "checkpoint pool"}
            assert all(isinstance(s, float) and s < DEAD_PEER_S + 20 for s in took.values()), \
                (took, err[-2000:])
        finally:
            proxy.close()
