"""A real full disk under the default layout: the SQLite database, its checkpoint file and the
usage spool all on one filesystem (a small tmpfs; root mounts it, as CI runs). Filled by a
ballast file at a chosen chat request, early in the night, mid-night, or at the last
request (the last ticker's rating): the night stops resumable in one line, every usage row
kept; once the ballast is gone one resume finishes with ``llm_calls`` equal to the server's
request log and one decision per sample. Before, the spool could not be written on the
full disk either: the rows the database refused were lost (``UsageLost``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from agents.data.demo import DEMO_AS_OF, write_demo
from app.batch.engine import BatchPlan
from app.db.engine import get_engine, upgrade
from app.db.models import Decision
from app.runs.resumable import find_resumable
from tests.dbfaults import check_rows_match
from tests.fakevllm import ChatRequest, FakeServer
from tests.integration.conftest import swappable_server
from tests.unit.support.bursts import TICKERS
from tests.unit.support.fault_night import NODES, QUICK_ENV, night_engine

pytestmark = pytest.mark.integration


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of this test's own."""
    if os.geteuid() != 0:
        pytest.fail("the full-disk test mounts a tmpfs: run it as root (CI does)")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                   check=True, timeout=30)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True, timeout=30)


def ballast_at(disk: Path, at: int) -> Any:
    """A fake server script that fills ``disk`` with a ballast file at chat request ``at``."""
    ballast = disk / "ballast"

    def fill(chat: ChatRequest) -> None:
        if chat.index == at and not ballast.exists():
            with ballast.open("wb") as out, pytest.raises(OSError):
                while True:
                    out.write(bytes(1 << 16))
                    out.flush()
    return fill


@pytest.mark.parametrize("at", [3, 20, 33], ids=["analysts", "debate", "last-rating"])
def test_a_full_disk_stops_the_night_resumable_and_loses_no_row(
        disk: Path, demo_dir: Path, at: int) -> None:
    home = disk / "home"
    url = f"sqlite:///{home}/nightdesk.db"
    home.mkdir()
    upgrade(url)
    db = get_engine(url)
    ballast = disk / "ballast"
    first = FakeServer(ballast_at(disk, at), nodes=NODES, tickers=TICKERS)
    try:
        outcome = asyncio.run(night_engine(db, demo_dir, first, home=home,
                                           db_write_budget_s=1.0).run(
            BatchPlan("nightly", DEMO_AS_OF, TICKERS)))
        assert outcome.status == "interrupted" and not outcome.failed, outcome
        assert outcome.halt is not None and "\n" not in outcome.halt.message
        assert f"nightdesk run --resume {outcome.batch_id}" in outcome.halt.message
        ballast.unlink()

        second = FakeServer(nodes=NODES, tickers=TICKERS)
        resumed = asyncio.run(night_engine(db, demo_dir, second, home=home).run(
            find_resumable(db, outcome.batch_id, stale_s=120)))
        assert resumed.status == "succeeded", resumed
        check_rows_match(db, first, second)
        with db.connect() as conn:
            decisions = Counter(conn.execute(select(Decision.ticker, Decision.sample)).all())
        assert sorted(decisions.values()) == [1] * len(TICKERS)
        assert not list((home / "spool").iterdir())  # taken up, nothing set aside left
    finally:
        db.dispose()




def test_a_real_night_on_a_full_disk_says_one_line_and_its_resume_finishes(
        disk: Path) -> None:
    # The same as processes: `nightdesk run` (its home on the full disk) against a fake
    # server on a port, then the advised `nightdesk run --resume` once space is back.
    home = disk / "home"
    write_demo(home / "data", DEMO_AS_OF, 3)
    model = "smollm2-135m"  # the settings' default
    servers = [FakeServer(ballast_at(disk, 20), nodes=NODES, tickers=TICKERS, model=model),
               FakeServer(nodes=NODES, tickers=TICKERS, model=model)]
    with swappable_server(servers[0], 18000) as (current, port):
        env = {**os.environ, **QUICK_ENV, "NIGHTDESK_HOME": str(home),
               "NIGHTDESK_LLM_BASE_URL": f"http://127.0.0.1:{port}/v1"}
        env.pop("NIGHTDESK_DATABASE_URL", None)
        nightdesk = [sys.executable, "-c", "from app.cli import main; main()"]
        first = subprocess.run(
            [*nightdesk, "run", "--tickers", ",".join(TICKERS), "--as-of", str(DEMO_AS_OF),
             "--no-preflight"], env={**env, "NIGHTDESK_DB_WRITE_BUDGET_S": "1"},
            capture_output=True, text=True, timeout=300)
        said = [line for line in first.stderr.splitlines() if line.startswith("error:")]
        assert first.returncode == 2 and len(said) == 1, first.stderr[-3000:]
        # The usage rows' or a checkpoint's write meets the full disk first, as it comes.
        assert said[0].startswith("error: batch 1 interrupted: ")
        assert "within the write budget (1 s): database or disk is full" in said[0]
        assert said[0].endswith("resume with `nightdesk run --resume 1`")
        (disk / "ballast").unlink()
        current[0] = servers[1]
        second = subprocess.run([*nightdesk, "run", "--resume", "1", "--no-preflight"],
                                env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr[-3000:]
        db = get_engine(f"sqlite:///{home}/nightdesk.db")
        check_rows_match(db, *servers)
        db.dispose()
