"""The token budget's factor: how scripted readings raise it, cut it and start it over.

Every budget here has a KV cache of 10,000 tokens, ``fill`` 0.95 and a start factor of 1,
so at factor 1 it may reserve 9,500: these test the factor's rules, so they pin the margins
their arithmetic was written in, not the defaults (0.98 and 1.05, test_budget.py). Its
clock stands at 0 and every reading is taken at 1,000 s, so each reading sees the
reservations as the test left them (except where a test moves the clock). Before each
reading the test asks for more than fits, so the budget has held something back: a budget
nobody runs into has nothing to prove.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from app.errors import InputError
from app.recorder.figures import budget as budgeted
from app.traffic.budget import Claim, TokenBudget
from app.traffic.strategy import Strategy
from tests.unit.support.budget_sim import G, SimServer, run_sim
from tests.unit.support.servers import over_one_server

AT = datetime.fromtimestamp(1_000, UTC)


def budget(**knobs: Any) -> TokenBudget:
    return TokenBudget(**{"capacity": 10_000, "block_size": 16, "clock": lambda: 0.0,
                          "fill": 0.95, "overbook": 1.0, **knobs})


def reading(usage: float, *, preempted: float = 0, generated: float = 0, waiting: float = 0,
            taken_at: datetime | None = AT) -> tuple[G, float, float]:
    """Return a reading and the preemptions and tokens generated since the last one."""
    return G(kv_cache_usage=usage, waiting=waiting, taken_at=taken_at), preempted, generated


def factors(b: TokenBudget, readings: list[tuple[G, float, float]], *, held_back: bool = True,
            restarted: bool = False) -> list[float]:
    """Observe each reading (after a refused request when ``held_back``); the factor after each.

    ``restarted``: the first reading is a restarted server's (limits.py detects it).
    """
    seen = []
    for i, (r, preempted, generated) in enumerate(readings):
        if held_back:
            assert not b.fits(10**6)
        b.observe(r, preempted=preempted, generated=generated, restarted=restarted and i == 0)
        seen.append(round(b.factor, 6))
    return seen


def test_an_under_used_cache_raises_the_factor_a_step_a_reading_up_to_the_ceiling() -> None:
    b = budget(overbook_max=1.1, overbook_step=0.02, rise_after=3)
    b.take(Claim(8_000, output=1_000))
    # 5,000 tokens in the cache and 1,000 of output still to come: a footprint of 6,000 for
    # 8,000 reserved, 0.75 per reserved token. Two readings build the streak, the third rises.
    assert factors(b, [reading(0.5)] * 8) == [1.0, 1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.1]
    assert b.limit == int(10_000 * 0.95 * 1.1)  # past the capacity's fill: overbooked
    summary = budgeted(b)
    assert summary.reason == "kv under-used: footprint 0.75 per reserved token"
    assert (summary.factor_peak, summary.rises, summary.cuts) == (1.1, 5, 0)
    assert summary.footprint_per_reserved_token == 0.75
    assert [e[:2] for e in summary.trajectory] == [
        [0, 1.0], [3, 1.02], [4, 1.04], [5, 1.06], [6, 1.08], [7, 1.1]]


def test_the_footprint_bounds_the_rise_below_a_high_ceiling() -> None:
    b = budget(overbook_max=3.0, overbook_step=0.1, rise_after=1)
    b.take(Claim(8_000, output=1_000))
    # 0.75 per reserved token: at factor f the full budget would come to 0.75 f of the
    # reservable 9,500, so f stops at 1.3 (1.4 × 0.75 = 1.05 would overflow the fill).
    assert factors(b, [reading(0.5)] * 6) == [1.1, 1.2, 1.3, 1.3, 1.3, 1.3]


def test_nothing_rises_while_the_budget_holds_nothing_back() -> None:
    b = budget(overbook_max=1.5)
    b.take(Claim(8_000, output=1_000))
    assert factors(b, [reading(0.5)] * 10, held_back=False) == [1.0] * 10
    assert budgeted(b).trajectory == [[0, 1.0, 1.0, "start"]]


def test_output_already_generated_is_no_longer_to_come() -> None:
    b = budget(overbook_max=1.5, rise_after=1)
    b.take(Claim(8_000, output=2_000))
    # 6,000 in the cache and all 2,000 of output still to come: 1.0 per reserved token.
    assert factors(b, [reading(0.6)]) == [1.0]
    # The server's counter says 1,000 were generated since: (6,000 + 1,000) / 8,000.
    assert factors(b, [reading(0.6, generated=1_000)]) == [1.02]
    assert b.footprint_share == 0.875
    # A jump of 30,000 (another client, say) counts only up to the 2,000 expected.
    assert factors(b, [reading(0.6, generated=30_000)]) == [1.04]
    assert b.footprint_share == 0.75
    # The answer came back with its 2,000 tokens: none of them is ours to subtract again.
    b.learn("trader", {"messages": []}, prompt_tokens=0, completion_tokens=2_000)
    b.give_back(Claim(8_000, output=2_000), hold=False)
    b.take(Claim(8_000, output=2_000))
    assert factors(b, [reading(0.6)]) == [1.0]
    assert b.footprint_share == 1.0


def test_a_preemption_cuts_the_factor_and_nothing_rises_for_calm_readings() -> None:
    b = budget(overbook_max=1.1, rise_after=3, calm=4, backoff=0.8)
    b.take(Claim(8_000, output=1_000))
    assert factors(b, [reading(0.5)] * 7)[-1] == 1.1
    assert factors(b, [reading(0.5, preempted=1)]) == [pytest.approx(0.88)]
    assert b.reason == "1 preemptions"
    # Four calm readings, then a streak of three, then a step up from the cut.
    assert factors(b, [reading(0.5)] * 7) == [0.88] * 6 + [0.9]


def test_kv_usage_at_kv_high_stops_the_rise_and_cuts_only_what_was_overbooked() -> None:
    b = budget(overbook_max=1.2, kv_high=0.9, high_cut=0.9)
    b.take(Claim(9_400))
    # 9,100 in the cache for 9,400 reserved (0.968 per token) would allow factor 1.02, but
    # the cache is at 91%: no rise, and no cut below the start factor either.
    assert factors(b, [reading(0.91)] * 5) == [1.0] * 5
    assert factors(b, [reading(0.5)] * 5)[-1] == pytest.approx(1.06)
    assert factors(b, [reading(0.91)]) == [1.0]  # 1.06 × 0.9 is below the start: the start
    assert b.reason == "kv usage 91% at kv_high"
    started_high = budget(overbook=1.1, overbook_max=1.3)
    started_high.take(Claim(9_400))
    assert factors(started_high, [reading(0.5)] * 5)[-1] == pytest.approx(1.16)
    # 1.16 × 0.9 = 1.044: the operator's start of 1.1 is kept; only a preemption goes below.
    assert factors(started_high, [reading(0.92)]) == [1.1]


def test_a_tighter_footprint_pulls_an_overbooked_factor_down_at_once() -> None:
    b = budget(overbook_max=1.2, overbook_step=0.1, rise_after=1)
    b.take(Claim(8_000, output=1_000))
    assert factors(b, [reading(0.5)] * 2) == [1.1, 1.2]
    # Now 6,600 in the cache + 1,000 to come: 0.95 per reserved token, so at most 1 / 0.95.
    assert factors(b, [reading(0.66)]) == [round(1 / 0.95, 6)]
    assert b.reason == "footprint 0.95 per reserved token: no room to overbook"


def test_a_restart_starts_the_factor_over() -> None:
    b = budget(overbook_max=1.1, rise_after=3)
    b.take(Claim(8_000, output=1_000))
    climb = [reading(0.5)] + [reading(0.5, generated=100)] * 6
    assert factors(b, climb)[-1] == 1.1
    # The counters went backwards: the server restarted. Back to the start, streak and all.
    after = [reading(0.5)] + [reading(0.5, generated=10)] * 3
    assert factors(b, after, restarted=True) == [1.0, 1.0, 1.0, 1.02]
    assert budgeted(b).trajectory[-2][1:] == [1.0, 1.0, "server restarted"]


def test_a_growing_server_queue_or_a_default_estimate_holds_the_rise() -> None:
    b = budget(overbook_max=1.5)
    for _ in range(16):
        b.take(Claim(500, output=62))  # 8,000 reserved, 992 output, 500 a typical request
    # Queued requests are counted at a typical size (footprint ≤ 7,492 of 8,000), so the
    # footprint allows a rise; the growing queue says the server is the limit: none.
    assert factors(b, [reading(0.5, waiting=w) for w in (1, 2, 3)]) == [1.0] * 3
    assert factors(b, [reading(0.5, waiting=3)] * 3) == [1.0, 1.0, 1.02]
    # A request costed from the defaults (no outputs of its node seen yet) is about to
    # shrink: while it is outstanding nothing is measured against it.
    guess = Claim(500, output=62, settled=False)
    b.take(guess)
    assert factors(b, [reading(0.5, waiting=3)] * 5) == [1.02] * 5
    b.give_back(guess, hold=False)
    assert factors(b, [reading(0.5, waiting=3)] * 3) == [1.02, 1.02, 1.04]


def test_requests_admitted_after_the_page_was_read_are_not_room() -> None:
    clock = [0.0]
    b = budget(overbook_max=1.5, rise_after=1, clock=lambda: clock[0])
    clock[0] = 1.0
    b.take(Claim(5_000))
    clock[0] = 5.0
    b.take(Claim(5_000))
    read_at = datetime.fromtimestamp(3.0, UTC)
    # At 3 s the cache held the first request's 5,000 tokens: all of what was reserved then.
    # The second request is not in the reading yet; it is not 5,000 tokens of spare room.
    assert factors(b, [reading(0.5, taken_at=read_at)]) == [1.0]
    # A reading after both: 5,000 in the cache for 10,000 reserved. That is room.
    assert factors(b, [reading(0.5, taken_at=datetime.fromtimestamp(6.0, UTC))]) == [1.02]
    # Without the reading's time the least reserved since the last reading is assumed:
    # 5,000 for 5,000 in the cache leaves no room, and the step up is taken back.
    b.give_back(Claim(5_000), hold=False)
    b.take(Claim(5_000))
    assert factors(b, [reading(0.5, taken_at=None)]) == [1.0]
    assert b.reason == "footprint 1.00 per reserved token: no room to overbook"


def test_long_outputs_growing_after_admission_never_fill_the_cache_past_the_fill() -> None:
    # Half of every prompt is a prefix already cached, which the budget's estimate cannot
    # see: real room. Answers of 400 tokens grow after admission. A ceiling of 3, large
    # steps and a kv_high the cache never reaches leave the footprint alone to bound the
    # factor. (Counting only what is in the cache, the factor reaches 2 here and the
    # answers, growing, overflow the cache: preemptions.)
    capacity = 6_400
    server, scheduler = run_sim("adaptive:overbook_max=3,overbook_step=0.1,kv_high=0.99",
                                capacity, tickers=16, shared=0.5)
    b = scheduler.endpoints.first.limits.budget
    assert b is not None
    assert b.peak_factor > 1.1 and b.rises > 0  # it did overbook...
    assert server.preemptions == 0  # ...and never overflowed the cache,
    assert server.peak_used <= capacity * 0.95  # nor passed the share it may fill
    assert server.peak_reserved > capacity  # reservations went past the capacity itself
    assert any("kv under-used" in e[3] for e in budgeted(b).trajectory)


def test_the_knobs_reach_the_budget_and_bad_ones_are_refused() -> None:
    strategy = Strategy.parse("adaptive:overbook=1.1,overbook_max=1.4,overbook_step=0.05,"
                              "rise_after=2,calm=7,high_cut=0.85,kv_high=0.93")
    scheduler = over_one_server(SimServer(1_000), strategy, gauges=SimServer(1_000))
    b = scheduler.endpoints.first.limits.budget
    assert b is not None
    assert (b.overbook, b.overbook_max, b.overbook_step, b.rise_after, b.calm, b.high_cut) == (
        1.1, 1.4, 0.05, 2, 7, 0.85)
    assert b.kv_high == 0.93  # the budget's own knob: the policy has no KV rule
    with pytest.raises(InputError, match="overbook_max"):
        Strategy.parse("adaptive:overbook=1.2,overbook_max=1.1")
    with pytest.raises(InputError, match="high_cut"):
        Strategy.parse("adaptive:high_cut=1.5")
