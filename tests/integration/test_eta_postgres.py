"""The ETA's replay on PostgreSQL reads what it reads on SQLite (times with their zones, calls
in the order they ended): the same estimates at every stored reading of a recorded night."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from app.db.engine import get_engine
from app.morning import eta
from tests.integration.conftest import private_database
from tests.unit.support.eta_fixture import fixture, load

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", ["gpu_sim40", "vllm_cpu"])
def test_the_replay_on_postgres_says_what_it_says_on_sqlite(sqlite_engine: Engine,
                                                            name: str) -> None:
    with private_database("nightdesk_wt_eta_replay", upgraded=True) as url:
        on_pg = get_engine(url)
        pg_id, _, readings = load(on_pg, fixture(name))
        lite_id, _, _ = load(sqlite_engine, fixture(name))
        for r in readings:
            pg = eta.reading(on_pg, pg_id, r["taken_at"])
            lite = eta.reading(sqlite_engine, lite_id, r["taken_at"])
            assert (pg.calls_done, pg.chain_left) == (lite.calls_done, lite.chain_left)
            assert (pg.eta_s, pg.eta_low_s, pg.eta_high_s) == pytest.approx(
                (lite.eta_s, lite.eta_low_s, lite.eta_high_s))
