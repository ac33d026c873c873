"""The data home's filesystem forced read-only mid-night, as the kernel does it (ext4's
``errors=remount-ro`` on an error of its own): an ext4 image on a loop device (root mounts
it, as CI runs), the error triggered through ``/sys/fs/ext4/<dev>/trigger_fs_error`` at a
chosen chat request of a SQLite night whose database, checkpoints and spool lie under it.

SQLite then says ``disk I/O error`` (a write through an open file) or ``attempt to write a
readonly database`` (a file opened since): the database cannot be written, which the night
takes as the database away, waited for within the write budget. Before, neither was
retried: ``sqlite3.OperationalError`` came out of the batch, the batch row stayed
``running`` and an answered request's usage row was lost. The rows held in memory at the
fault are kept off the home (the runtime directory, the units' /run/nightdesk) and stored
by the resume: before, they were lost (2 of them)."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, write_demo
from app.db.engine import get_engine
from app.db.models import LLMCall
from tests.fakevllm import ChatRequest, FakeServer
from tests.integration.conftest import swappable_server
from tests.unit.support.bursts import TICKERS
from tests.unit.support.fault_night import NODES, QUICK_ENV

pytestmark = pytest.mark.integration


class Ext4:
    """A 64 MiB ext4 filesystem of this test's own, mounted ``errors=remount-ro``."""

    def __init__(self, image: Path, mount: Path, device: str) -> None:
        self.image, self.mount, self.device = image, mount, device

    @property
    def read_only(self) -> bool:
        try:  # the flags in /proc/mounts and statvfs lag the aborted journal
            (self.mount / "probe").write_bytes(b"")
        except OSError as error:
            return error.errno == errno.EROFS
        return False

    def fail(self) -> None:
        """An error of the filesystem's own: the kernel remounts it read-only."""
        name = Path(self.device).name
        # The journal is aborted at once (every write fails from here); the remount itself
        # follows from a work queue.
        Path(f"/sys/fs/ext4/{name}/trigger_fs_error").write_text("nightdesk test\n")

    def writable(self) -> None:
        """What an administrator does: unmount, check, mount again (its journal aborted, the
        filesystem takes no read-write remount)."""
        subprocess.run(["umount", str(self.mount)], check=True, timeout=30)
        fsck = subprocess.run(["e2fsck", "-fy", str(self.image)], timeout=60,
                              capture_output=True, text=True)
        assert fsck.returncode in (0, 1), fsck.stdout  # 1: errors corrected
        self.mount_it()
        assert not self.read_only

    def mount_it(self) -> None:
        subprocess.run(["mount", "-t", "ext4", "-o", "errors=remount-ro", self.device,
                        str(self.mount)], check=True, timeout=30)


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Ext4]:
    if os.geteuid() != 0:
        pytest.fail("the read-only home test mounts a loop device: run it as root (CI does)")
    image, mount = tmp_path / "home.img", tmp_path / "mnt"
    mount.mkdir()
    with image.open("wb") as out:
        out.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, timeout=60)
    device = subprocess.run(["losetup", "--find", "--show", str(image)], check=True,
                            timeout=30, capture_output=True, text=True).stdout.strip()
    try:
        disk = Ext4(image, mount, device)
        disk.mount_it()
        try:
            yield disk
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=True, timeout=30)
    finally:
        subprocess.run(["losetup", "-d", device], check=False, timeout=30)


def check_rows_kept(db: Engine, servers: list[FakeServer]) -> None:
    """Every request the servers saw has its usage row, stored once."""
    with db.connect() as conn:
        calls = conn.execute(select(LLMCall.ticker, LLMCall.node, LLMCall.call_id,
                                    LLMCall.attempt)).all()
    assert len({(c.call_id, c.attempt) for c in calls}) == len(calls)
    seen = Counter((c.ticker, c.node) for s in servers for c in s.chats)
    assert Counter((c.ticker, c.node) for c in calls) == seen


def fail_at(disk: Ext4, at: int) -> Any:
    def fail(chat: ChatRequest) -> None:
        if chat.index == at and not disk.read_only:
            disk.fail()
    return fail


def test_a_home_forced_read_only_stops_the_night_in_one_line_and_its_resume_finishes(
        ext4: Ext4, tmp_path: Path) -> None:
    home, run = ext4.mount / "home", tmp_path / "run"  # the runtime directory: off the home
    write_demo(home / "data", DEMO_AS_OF, 3)
    os.sync()  # an aborted journal loses what it had not committed: not the snapshot
    model = "smollm2-135m"  # the settings' default
    servers = [FakeServer(fail_at(ext4, 12), nodes=NODES, tickers=TICKERS, model=model),
               FakeServer(nodes=NODES, tickers=TICKERS, model=model)]
    with swappable_server(servers[0], 18100) as (current, port):
        env = {**os.environ, **QUICK_ENV, "NIGHTDESK_HOME": str(home),
               "RUNTIME_DIRECTORY": str(run),
               "NIGHTDESK_LLM_BASE_URL": f"http://127.0.0.1:{port}/v1"}
        env.pop("NIGHTDESK_DATABASE_URL", None)
        nightdesk = [sys.executable, "-c", "from app.cli import main; main()"]
        first = subprocess.run(
            [*nightdesk, "run", "--tickers", ",".join(TICKERS), "--as-of", str(DEMO_AS_OF),
             "--no-preflight"], env={**env, "NIGHTDESK_DB_WRITE_BUDGET_S": "2"},
            capture_output=True, text=True, timeout=300)
        said = [line for line in first.stderr.splitlines() if line.startswith("error:")]
        assert first.returncode == 2 and len(said) == 1, first.stderr[-3000:]
        assert "Traceback" not in first.stderr
        # The cause (what SQLite said, what it means) and the fix, in the one line.
        assert "disk I/O error (the database file cannot be written: its filesystem " \
            "read-only" in said[0], said[0]
        assert said[0].endswith("resume with `nightdesk run --resume 1`"), said[0]
        # The rows in memory: kept off the home, and the line says where.
        kept = re.search(r"kept in (\S+) \(not in \S+: Read-only file system; a reboot "
                         r"empties that place\) for the resume", said[0])
        assert kept and Path(kept.group(1)).parent == run, said[0]
        assert ext4.read_only
        # Read on the read-only disk: the night reads crashed, the same on each surface.
        for command in (["report", "1"], ["batches"]):
            read = subprocess.run([*nightdesk, *command], env=env, capture_output=True,
                                  text=True, timeout=120)
            assert read.returncode == 0 and "crashed" in read.stdout, read.stderr[-3000:]
        assert " running " not in read.stdout.split("\n")[3]  # batches' row: crashed alone
        ext4.writable()
        current[0] = servers[1]
        second = subprocess.run([*nightdesk, "run", "--resume", "1", "--no-preflight"],
                                env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr[-3000:]
        db = get_engine(f"sqlite:///{home}/nightdesk.db")
        check_rows_kept(db, servers)
        assert not list(run.iterdir())  # stored, then given up
        db.dispose()


@pytest.fixture
def read_only_home(tmp_path: Path) -> Iterator[Path]:
    """A data home with a database and no night, then bound read-only (as a home on a disk
    mounted read-only is)."""
    if os.geteuid() != 0:
        pytest.fail("the read-only home test bind-mounts a folder: run it as root (CI does)")
    source, home = tmp_path / "source", tmp_path / "home"
    home.mkdir()
    write_demo(source / "data", DEMO_AS_OF, 3)  # a snapshot to run on: not what is refused
    made = subprocess.run([sys.executable, "-c", "from app.cli import main; main()", "batches"],
                          env={**os.environ, "NIGHTDESK_HOME": str(source)},
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    subprocess.run(["mount", "--bind", str(source), str(home)], check=True, timeout=30)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(home)], check=True, timeout=30)
        yield home
    finally:
        subprocess.run(["umount", str(home)], check=True, timeout=30)


def test_a_read_only_home_with_no_night_says_so_and_advises_making_it_writable(
        read_only_home: Path) -> None:
    # No server at this address: the run is refused before its first call.
    env = {**os.environ, "NIGHTDESK_HOME": str(read_only_home),
           "NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:18299/v1"}
    env.pop("NIGHTDESK_DATABASE_URL", None)
    nightdesk = [sys.executable, "-c", "from app.cli import main; main()"]
    said = {}
    for command in (["ranking"], ["run", "--tickers", ",".join(TICKERS), "--as-of",
                                  str(DEMO_AS_OF), "--no-preflight"]):
        done = subprocess.run([*nightdesk, *command], env=env, capture_output=True, text=True,
                              timeout=120)
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode != 0 and len(lines) == 1, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        said[command[0]] = lines[0]
    # The cause named (the home's path, read-only), and what to do before `nightdesk run`.
    why = f"{read_only_home} is on a read-only filesystem"
    assert f"next: `nightdesk run` (runs the first night once the data home is writable: " \
        f"{why}; remount it read-write, or set NIGHTDESK_HOME to a writable folder)" \
        in said["ranking"], said["ranking"]
    assert said["run"] == (
        f"error: cannot open the checkpoint file {read_only_home}/nightdesk.checkpoints.db: "
        f"{why}: make it writable (remount its filesystem read-write, or set NIGHTDESK_HOME "
        "to a writable folder), then run the command again"), said["run"]
