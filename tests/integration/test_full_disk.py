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
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from agents.data.demo import DEMO_AS_OF
from app.batch.engine import BatchPlan
from app.db.engine import get_engine, upgrade
from app.db.models import Decision
from app.runs.resumable import find_resumable
from tests.dbfaults import check_rows_match
from tests.fakevllm import ChatRequest, FakeServer
from tests.unit.support.bursts import TICKERS
from tests.unit.support.fault_night import NODES, night_engine

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


@pytest.mark.parametrize("at", [3, 20, 33], ids=["analysts", "debate", "last-rating"])
def test_a_full_disk_stops_the_night_resumable_and_loses_no_row(
        disk: Path, demo_dir: Path, at: int) -> None:
    home = disk / "home"
    url = f"sqlite:///{home}/nightdesk.db"
    home.mkdir()
    upgrade(url)
    db = get_engine(url)
    ballast = disk / "ballast"

    def fill(chat: ChatRequest) -> None:
        if chat.index == at and not ballast.exists():
            with ballast.open("wb") as out, pytest.raises(OSError):
                while True:
                    out.write(bytes(1 << 16))
                    out.flush()

    first = FakeServer(fill, nodes=NODES, tickers=TICKERS)
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
