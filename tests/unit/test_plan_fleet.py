"""``nightdesk plan`` against the simulated fleet's measured makespans (tests/bench/fleet.py).

The plan's makespan is a bound: no simulated night may beat it, and a client that serves the
graph well comes within 10% of it. Checked, slow, on a small night run here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bench.fleet import plan_for
from tests.unit.test_bench_sims import bench


def check(result: dict[str, Any]) -> None:
    measured = result["arm"]["makespan_s"]
    planned = plan_for(result).makespan_s
    assert planned <= measured, (planned, measured)  # a bound: nothing beats it
    assert planned >= 0.9 * measured, (planned, measured)
    # The JSON's own figures are the same model's (fleet.capacity) and carry the targets'.
    assert result["capacity"]["share_of_graph_bound"] == pytest.approx(planned / measured)
    assert result["capacity"]["share_of_summed_capacity"] > 0
    assert result["loop_lag"]["p99_s"] is not None


@pytest.mark.slow
def test_plan_is_within_10_percent_of_a_small_simulated_night(tmp_path: Path) -> None:
    # 8 tickers over 2 endpoints at full speed: the 14-call chain sets the night (about
    # 90 s, little CPU); few tickers, so adaptive's start (4 requests, doubling each
    # reading) reaches them all within 2 readings.
    result = bench("tests.bench.fleet", "--tickers", "8", "--endpoints", "2", "--speedup", "1",
                   "--output-scale", "0.2", "--database", "sqlite", tmp_path=tmp_path)
    assert result["arm"]["failed_calls"] == 0
    check(result)
