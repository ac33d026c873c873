"""A live night whose batch row another transaction holds (``SELECT ... FOR UPDATE``) past
``heartbeat_stale_s`` reads running on every surface on PostgreSQL; SIGKILL'd, it reads
crashed on every surface at once.

Its heartbeat cannot land while the row is held (one missed beat after another,
docs/lab/2026-12-06-db-stalls.md), nor can its calls' rows (their key locks the row too);
what shows it alive is the nightly lock's holder, its own runner, still trying its heartbeat
on the lock's connection at every beat. Before, every surface read it crashed, and
``report`` tried to mark its row so. Run as a real process (``slow_night``) on the real
PostgreSQL at 127.0.0.1:5432, heartbeat_stale_s 3 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from agents.data.demo import demo_tickers
from app.config import load_settings
from app.db.engine import get_engine
from app.db.models import Batch, LLMCall
from tests.dbfaults import RowHeld
from tests.integration.conftest import private_database
from tests.integration.tied import popen
from tests.integration.unattended import ROOT, wait_for
from tests.unit.support.fault_night import QUICK_ENV
from tests.unit.support.surfaces import every_surface
from tests.unit.support.webclient import web_client

pytestmark = [pytest.mark.integration, pytest.mark.demo_tickers(2)]
STALE_S = 3.0


def test_a_night_whose_row_is_held_past_the_stale_bound_reads_running_then_killed_crashed(
        demo_dir: os.PathLike[str], tmp_path: os.PathLike[str]) -> None:
    with private_database(f"nightdesk_live_{os.getpid()}", upgraded=True) as url:
        env = {**QUICK_ENV, "NIGHTDESK_DATABASE_URL": url, "NIGHTDESK_DATA_DIR": str(demo_dir),
               "NIGHTDESK_HEARTBEAT_INTERVAL_S": "0.5",
               "NIGHTDESK_HEARTBEAT_STALE_S": str(STALE_S),
               "NIGHTDESK_DB_STATEMENT_TIMEOUT_S": "0.5", "NIGHTDESK_DB_WRITE_BUDGET_S": "300"}
        log = open(f"{tmp_path}/night.log", "w")  # noqa: SIM115 (closed below)
        night = popen([sys.executable, "-m", "tests.integration.slow_night", str(demo_dir),
                       ",".join(demo_tickers(2)), "1.0"], cwd=ROOT, stdout=log,
                      stderr=subprocess.STDOUT,
                      env={**os.environ, **env, "PYTHONPATH": str(ROOT)})
        engine = get_engine(url)
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        settings = load_settings(database_url=url, heartbeat_stale_s=STALE_S,
                                 heartbeat_interval_s=0.5, schedule_timezone="UTC")

        def answered() -> int | None:
            with engine.connect() as conn:
                return conn.execute(select(LLMCall.batch_id).limit(1)).scalar()

        def beat_age_s() -> float:
            with engine.connect() as conn:
                beat = conn.execute(select(Batch.heartbeat_at)).scalar_one()
            return (datetime.now(UTC) - beat).total_seconds()

        try:
            batch_id = wait_for(answered, 120, "the night's first recorded call")
            held = RowHeld(dsn, batch_id, 120.0)
            try:
                wait_for(lambda: beat_age_s() > STALE_S + 1, 30, "its heartbeat to go stale")
                with web_client(engine, settings=settings) as client:
                    said = every_surface(engine, client, batch_id, settings, env)
                    assert set(said.values()) == {"running"}, said
                    assert beat_age_s() > STALE_S  # all read while its row was held
                    assert night.poll() is None  # and the night lived on
                    night.kill()
                    night.wait()
                    held.release()  # (a command that marks it need not wait on the row)
                    said = every_surface(engine, client, batch_id, settings, env)
            finally:
                held.release()
        finally:
            if night.poll() is None:
                night.kill()
                night.wait()
            log.close()
        assert (said.pop("running list"), said.pop("running_night")) == ("absent", "none")
        assert set(said.values()) == {"crashed"}, said
