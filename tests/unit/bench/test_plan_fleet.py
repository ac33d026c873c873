"""``nightdesk plan`` against the simulated fleet's measured makespans (tests/bench/fleet.py).

The plan's makespan is a bound: no simulated night may beat it, and a client that serves the
graph well comes within 10% of it. Checked on the committed 2026-12-05 runs of 500 tickers
(over 8 at 4673e73, over 5 at 72e74de: the latest run of each at a load average under 5)
and, slow, on a small night run here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench.fleet import plan_for
from tests.unit.support.sims import bench

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "docs" / "bench"
EIGHT = BENCH / "fleet-sim-500-tickers-8-endpoints-2026-12-05-4673e73.json"
FIVE = BENCH / "fleet-sim-500-tickers-5-endpoints-2026-12-05-tail-order-72e74de.json"


def check(result: dict[str, Any]) -> None:
    measured = result["arm"]["makespan_s"]
    planned = plan_for(result).makespan_s
    assert planned <= measured, (planned, measured)  # a bound: nothing beats it
    assert planned >= 0.9 * measured, (planned, measured)
    # The JSON's own figures are the same model's (fleet.capacity) and carry the targets'.
    assert result["capacity"]["share_of_graph_bound"] == pytest.approx(planned / measured)
    assert result["capacity"]["share_of_summed_capacity"] > 0
    assert result["loop_lag"]["p99_s"] is not None


def test_plan_is_within_10_percent_of_the_500_ticker_night_over_8_endpoints() -> None:
    # The chain sets it: plan 147.75 s, measured 159.4 s (0.93; where the rest went:
    # docs/lab/2026-12-05-fleet-restated-targets.md).
    check(json.loads(EIGHT.read_text()))


@pytest.mark.xfail(strict=True, reason="0.86 of the bound: the token budget's fill and prompt "
                   "margin leave ~0.905 of the cache reservable where it binds "
                   "(docs/lab/2026-12-05-fleet-tail-order.md)")
def test_plan_is_within_10_percent_of_the_500_ticker_night_over_5_endpoints() -> None:
    result = json.loads(FIVE.read_text())
    planned = plan_for(result).makespan_s
    assert planned <= result["arm"]["makespan_s"]  # still a bound: this part holds
    check(result)


@pytest.mark.slow
def test_plan_is_within_10_percent_of_a_small_simulated_night(tmp_path: Path) -> None:
    # 8 tickers over 2 endpoints at full speed: the 14-call chain sets the night (about
    # 90 s, little CPU); few tickers, so adaptive's start (4 requests, doubling each
    # reading) reaches them all within 2 readings.
    result = bench("tests.bench.fleet", "--tickers", "8", "--endpoints", "2", "--speedup", "1",
                   "--output-scale", "0.2", "--database", "sqlite", tmp_path=tmp_path)
    assert result["arm"]["failed_calls"] == 0
    check(result)
