"""Read commands and the web pages serve what is stored while SQLite takes no writes.

A read-only database (``?mode=ro``; a read-only file in a read-only folder), a full disk
(no byte more may be written: the WAL's shared-memory file cannot be made) and a full
database (``PRAGMA max_page_count``). The rows are web_rows.fill's; night 2 is still
``running`` with a long stale heartbeat, so ``report`` tries its one write (marking it
crashed). Expected values come from fill's docstring, and each read is also compared with
the same read of a writable copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from app.db.engine import get_engine, upgrade
from tests.unit.support.clirun import run_cli
from tests.unit.support.read_checks import STALE, check_reads, comparable, read_all
from tests.unit.support.web_rows import Ids, fill
from tests.unit.support.webclient import AUTH, web_client

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, Ids]:
    """A database file with the rows, closed: no WAL or shared-memory file beside it."""
    path = tmp_path / "db" / "nightdesk.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    ids = fill(get_engine(url), night2_heartbeat=STALE)
    get_engine(url).dispose()
    assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
    return path, ids


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def writable_reads(path: Path, ids: Ids, tmp_path: Path) -> dict[str, dict[str, Any]]:
    copy = tmp_path / "writable" / "nightdesk.db"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    return read_all(f"sqlite:///{copy}", ids)


def test_read_commands_and_pages_serve_a_read_only_database(
        stored: tuple[Path, Ids], tmp_path: Path) -> None:
    path, ids = stored
    before = _digest(path)
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    check_reads(read_all(url, ids), writable_reads(path, ids, tmp_path), ids)
    engine = get_engine(url)
    with web_client(engine) as client:
        for page in ("/", "/ticker/AAA", "/batches", f"/batches/{ids.night1}", "/track",
                     "/api/batches", f"/api/batches/{ids.night1}", "/api/tickers/AAA"):
            assert client.get(page, auth=AUTH).status_code == 200, page
        rows = client.get("/api/ranking", auth=AUTH).json()["rows"]
        assert [(r["ticker"], r["rating"]) for r in rows] == [("AAA", "Buy"), ("BBB", "Sell")]
        assert client.get("/healthz").json()["database"] == "ok"
    engine.dispose()
    assert _digest(path) == before


# Runs the read commands in a child that cannot write what the test took away from it, and
# prints their results as JSON.
CHILD = """
import json, sys
from tests.unit.support.clirun import run_cli
from tests.unit.support.read_checks import read_all
from tests.unit.support.web_rows import Ids
print(json.dumps(read_all(sys.argv[1], Ids(*map(int, sys.argv[2:])))))
"""


def _child(url: str, ids: Ids, *, prefix: list[str], limit_writes: bool,
           home: Path) -> dict[str, dict[str, Any]]:
    def no_file_may_grow() -> None:
        # A full disk: no file may get a byte more. SIGXFSZ ignored turns it into EFBIG.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    env = {**os.environ, "NIGHTDESK_HOME": str(home), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*prefix, sys.executable, "-c", CHILD, url, str(ids.night1), str(ids.rerun),
         str(ids.night2), str(ids.night0)], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300, preexec_fn=no_file_may_grow if limit_writes else None)
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return found


@pytest.mark.slow  # a child process of its own
def test_read_commands_serve_a_read_only_file_in_a_read_only_folder(
        stored: tuple[Path, Ids], tmp_path: Path) -> None:
    path, ids = stored
    writable = writable_reads(path, ids, tmp_path)
    before = _digest(path)
    prefix: list[str] = []
    if os.geteuid() == 0:
        # root writes anything whatever its mode says; without these capabilities it obeys.
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    home = tmp_path / "home"
    home.mkdir()
    path.chmod(0o444)
    path.parent.chmod(0o555)
    try:
        found = _child(f"sqlite:///{path}", ids, prefix=prefix, limit_writes=False, home=home)
    finally:
        path.parent.chmod(0o755)
        path.chmod(0o644)
    check_reads(found, writable, ids)
    assert "database cannot be written now" in found["ranking"]["stderr"]
    assert _digest(path) == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["nightdesk.db"]


@pytest.mark.slow  # a child process of its own
def test_read_commands_serve_a_database_on_a_full_disk(
        stored: tuple[Path, Ids], tmp_path: Path) -> None:
    path, ids = stored
    writable = writable_reads(path, ids, tmp_path)
    before = _digest(path)
    home = tmp_path / "home"
    home.mkdir()
    found = _child(f"sqlite:///{path}", ids, prefix=[], limit_writes=True, home=home)
    check_reads(found, writable, ids)
    assert "database cannot be written now" in found["ranking"]["stderr"]
    assert _digest(path) == before


def test_read_commands_serve_a_full_database(stored: tuple[Path, Ids], tmp_path: Path) -> None:
    """``max_page_count`` at the file's size: the database can take no page more."""
    path, ids = stored
    writable = writable_reads(path, ids, tmp_path)
    url = f"sqlite:///{path}"
    engine = get_engine(url)

    @event.listens_for(engine, "connect")
    def _full(dbapi_conn: Any, _record: Any) -> None:
        pages = dbapi_conn.execute("PRAGMA page_count").fetchone()[0]
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")

    with pytest.raises(OperationalError, match="database or disk is full"), \
            engine.begin() as conn:
        conn.execute(text("INSERT INTO batch_warnings (batch_id, kind, message, created_at)"
                          " VALUES (:b, 'x', :m, '2026-01-01')"),
                     {"b": ids.night1, "m": "x" * 100_000})
    found = read_all(url, ids)
    for name, result in found.items():
        assert result["code"] == 0, (name, result["stderr"])
    for name in ("ranking", "report", "batches", "changes"):
        assert comparable(name, found) == comparable(name, writable), name
    event.remove(engine, "connect", _full)
    engine.dispose()


@pytest.mark.parametrize("argv", [("quality", "acknowledge"), ("scheduler",)])
def test_a_command_that_must_write_is_refused_in_one_line(
        stored: tuple[Path, Ids], argv: tuple[str, ...], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The checkpoint store still makes the URI's folders ("file:/…") under the working
    # directory: here the test's own.
    monkeypatch.chdir(tmp_path)
    # Each of these writes before it can do anything (an acknowledgement's row, the daemon's
    # job table); before, SQLAlchemy's traceback, exit 1.
    path, _ = stored
    before = _digest(path)
    result = run_cli(*argv, env={"NIGHTDESK_DATABASE_URL":
                                 f"sqlite:///file:{path}?mode=ro&uri=true"})
    assert result.code == 2, result.stderr
    assert "Traceback" not in result.stderr and "sqlalche.me" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("error: the database takes no writes now (attempt to write a readonly "
                    "database); make it writable, or free space on its disk, and run the "
                    "command again"), last
    assert _digest(path) == before
