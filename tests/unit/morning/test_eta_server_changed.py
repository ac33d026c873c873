"""The ETA after a night before on a very different server: k times faster, or k times slower.

Tonight (``TONIGHT``): 4 tickers at once, each one's analysts side by side for 8 s, then its
13 chain nodes 4 s each, one after another: 60 s, every call ready for its whole latency and
issued half-way. The night before ran the same calls k times quicker (k < 1: slower), on
another server; in its ``dear`` form one analyst node kept the night before's latency within
5 times tonight's, as a fixed cost or a prefill that a server change does not scale does
(0.19 s on one analyst, 3 ms on the chain's nodes, for k = 300). A pace pooled over every
node, weighed by the dear one, must not stand for the chain's nodes, and the night before's
times must not stand once tonight's calls show another server;
docs/lab/2026-12-06-eta-prior-mismatch.md has the tables. Below ``FAR`` (1.5-3 times, every
node's, the chain's or the analysts'): until a stage has answered, its range spans a pace
``FAR`` times apart and is called uncalibrated; docs/lab/2026-12-07-eta-below-far.md.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import time_machine
from sqlalchemy import Engine

from agents.nodes import ANALYSTS
from app.config import load_settings
from app.morning import eta, nightstatus
from app.morning.prometheus import NightCollector
from tests.unit.support.eta_rows import CHAIN, LATENCY_S, T0, night

TONIGHT = {**dict.fromkeys(ANALYSTS, 2 * LATENCY_S), **dict.fromkeys(CHAIN, LATENCY_S)}
NIGHT_S = 2 * LATENCY_S + len(CHAIN) * LATENCY_S
CHAIN_BEGINS = 2 * LATENCY_S / NIGHT_S  # tonight's first answers (13%); the chain's at 20%
MOMENTS = [0.05, 0.12, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.97]
PACES = [300, 30, 5, 1 / 5, 1 / 30, 1 / 300]
BELOW_FAR = [1.5, 2, 3, 1 / 1.5, 1 / 2, 1 / 3]  # within FAR: the night before's server
MOVED = {"uniform": [*ANALYSTS, *CHAIN], "chain": CHAIN, "analysts": list(ANALYSTS)}
CHAIN_ANSWERED = CHAIN_BEGINS + LATENCY_S / NIGHT_S  # the chain's first answers: 20%


def replay(engine: Engine, k: float, dear: bool = False,
           moved: str = "uniform") -> list[tuple[float, float, eta.Reading]]:
    """Return (share of the night, seconds left, the reading) at each of ``MOMENTS`` and
    10% of the night, the night before's ``moved`` nodes k times quicker."""
    before = {n: v / k if n in MOVED[moved] else v for n, v in TONIGHT.items()}
    if dear:
        before[ANALYSTS[0]] = TONIGHT[ANALYSTS[0]] / (5 if k > 1 else 1 / 5)
    night(engine, 4, before, T0 - timedelta(days=1))
    batch_id, end = night(engine, 4, TONIGHT, T0, status="running")
    assert (end - T0).total_seconds() == NIGHT_S
    shares = sorted([0.1, *MOMENTS])
    moments = [T0 + timedelta(seconds=f * NIGHT_S) for f in shares]
    return [(f, (end - at).total_seconds(), eta.reading(engine, batch_id, at))
            for f, at in zip(shares, moments, strict=True)]


@pytest.mark.parametrize("dear", [False, True], ids=["uniform", "one analyst dear"])
@pytest.mark.parametrize("k", PACES, ids=[f"{k:g}x" for k in PACES])
def test_once_both_stages_answered_tonight_the_eta_is_tonights_pace_and_its_interval_holds(
        sqlite_engine: Engine, k: float, dear: bool) -> None:
    for f, left, found in replay(sqlite_engine, k, dear):
        if f < CHAIN_ANSWERED:
            continue  # before the chain's first answer: the next test
        assert found.eta_s is not None, (f, found.estimating)
        assert abs(found.eta_s - left) <= 0.25 * left, (f, found.eta_s, left)
        assert found.eta_low_s is not None and found.eta_high_s is not None
        assert found.eta_low_s <= left <= found.eta_high_s, (f, found)
        assert (found.whole(found.eta_s) or 0) >= 1  # never 0 while a call is left


@pytest.mark.parametrize("dear", [False, True], ids=["uniform", "one analyst dear"])
@pytest.mark.parametrize("k", PACES, ids=[f"{k:g}x" for k in PACES])
def test_before_tonights_pace_is_known_it_says_estimating_not_a_confident_low_number(
        sqlite_engine: Engine, k: float, dear: bool) -> None:
    for f, left, found in replay(sqlite_engine, k, dear):
        if f >= CHAIN_ANSWERED:
            break
        outlasted = f * NIGHT_S > eta.FAR * 2 * LATENCY_S / k  # the cheapest analyst's
        if f >= CHAIN_BEGINS or (k > 1 and outlasted):
            # The analysts' pace is far from the night before's, or a call has been under
            # way FAR times as long as any of its node took then: the night before prices
            # no stage that has not answered tonight.
            assert (found.eta_s, found.estimating) == (None, eta.UNLIKE), (f, found)
        else:
            # Before, the night before's times stand, in a range called uncalibrated: too
            # high after a slower night; after a quicker one too low until a call outlasts
            # its node's by FAR (only k = 5 at 5% and 10% here: 21 s and 42 s said, 57 and
            # 54 s left), the pace lifted as far as tonight's calls have outlasted it.
            assert found.eta_s is not None and (found.whole(found.eta_s) or 0) >= 1
            assert found.eta_s > left if k < 1 else found.eta_s < left, (f, found)
            assert found.level is None, (f, found)


def test_a_night_before_twice_as_slow_keeps_the_calibrated_interval(
        sqlite_engine: Engine) -> None:
    # Within FAR of the night before's pace the night before prices every node at the pooled
    # pace, in the calibrated interval, as on the recorded nights (under LAST_S, the last
    # calls', give or take LAST_S).
    for f, _, found in replay(sqlite_engine, 1 / 2, dear=False):
        if f >= CHAIN_ANSWERED:  # both stages answered: each has a pace of its own
            assert found.eta_s is not None and found.level == eta.LEVEL
            low = found.eta_s * eta.RATIO[0]
            if found.eta_s < eta.LAST_S:
                low = min(low, max(0.0, found.eta_s - eta.LAST_S))
            assert found.eta_low_s == low


def test_the_night_status_every_face_reads_says_why(sqlite_engine: Engine) -> None:
    night(sqlite_engine, 4, {n: v / 300 for n, v in TONIGHT.items()}, T0 - timedelta(days=1))
    batch_id, _ = night(sqlite_engine, 4, TONIGHT, T0, status="running")
    prog = nightstatus.progress(sqlite_engine, batch_id, T0 + timedelta(seconds=6))
    assert (prog.calls, prog.eta_s, prog.eta_low_s) == (0, None, None)
    assert nightstatus.time_left(prog) == eta.UNLIKE


def test_a_range_set_on_another_server_is_called_uncalibrated_on_every_face(
        sqlite_engine: Engine) -> None:
    # No recorded night ran on another server, so the range's share is unmeasured: no face
    # may name the replays' level for it.
    night(sqlite_engine, 4, {n: v / 300 for n, v in TONIGHT.items()}, T0 - timedelta(days=1))
    batch_id, _ = night(sqlite_engine, 4, TONIGHT, T0, status="running")
    at = T0 + timedelta(seconds=0.5 * NIGHT_S)
    found = eta.reading(sqlite_engine, batch_id, at)
    assert found.eta_s is not None and found.level is None
    prog = nightstatus.progress(sqlite_engine, batch_id, at)
    said = nightstatus.time_left(prog)
    assert prog.eta_level is None and "uncalibrated range:" in said, said
    assert f"{eta.LEVEL:.0%}" not in said


def test_a_range_from_the_replays_names_their_level(sqlite_engine: Engine) -> None:
    night(sqlite_engine, 4, {n: v * 2 for n, v in TONIGHT.items()}, T0 - timedelta(days=1))
    batch_id, _ = night(sqlite_engine, 4, TONIGHT, T0, status="running")
    prog = nightstatus.progress(sqlite_engine, batch_id, T0 + timedelta(seconds=0.5 * NIGHT_S))
    assert prog.eta_level == eta.LEVEL
    assert f"({eta.LEVEL:.0%} interval:" in nightstatus.time_left(prog)


@pytest.mark.parametrize("moved", MOVED)
@pytest.mark.parametrize("k", BELOW_FAR, ids=[f"{k:.3g}x" for k in BELOW_FAR])
def test_until_a_stage_answers_its_range_spans_a_pace_up_to_far_apart_uncalibrated(
        sqlite_engine: Engine, k: float, moved: str) -> None:
    # Before a stage's first answer tonight nothing says whether it kept the night before's
    # pace: the range holds the time left, and no face calls it the replays' level.
    for f, left, found in replay(sqlite_engine, k, moved=moved):
        if f >= CHAIN_ANSWERED:
            break
        assert found.eta_s is not None and found.level is None, (f, found)
        assert found.eta_low_s is not None and found.eta_high_s is not None
        assert found.eta_low_s <= left <= found.eta_high_s, (f, left, found)


@pytest.mark.parametrize("k", BELOW_FAR[:3], ids=[f"{k:g}x" for k in BELOW_FAR[:3]])
def test_a_call_outlasting_its_nodes_the_night_before_lifts_the_pace_before_any_answer(
        sqlite_engine: Engine, k: float) -> None:
    # After a night before k times quicker, at 10% and 12% the analysts (8 s tonight) have
    # been under way 6 and 7.2 s, past the 8/k s any took then: tonight is at least that
    # much slower, and every node goes at that pace (before: -31% to -65%).
    for f, left, found in replay(sqlite_engine, k):
        if f in (0.1, 0.12):
            assert found.eta_s is not None
            assert abs(found.eta_s - left) <= 0.25 * left, (f, found.eta_s, left)


@pytest.mark.parametrize("k", BELOW_FAR, ids=[f"{k:.3g}x" for k in BELOW_FAR])
def test_a_change_alike_in_both_stages_is_priced_right_once_both_answered(
        sqlite_engine: Engine, k: float) -> None:
    for f, left, found in replay(sqlite_engine, k):
        if f >= CHAIN_ANSWERED:
            assert found.eta_s is not None and found.level == eta.LEVEL
            assert abs(found.eta_s - left) <= 0.25 * left, (f, found.eta_s, left)
            assert found.eta_low_s <= left <= found.eta_high_s  # type: ignore[operator]


ONE_STAGE = (
    "a change in one stage under FAR is priced at the pace pooled over both (the analysts' "
    "calls weigh most), as on the recorded nights, where a pace per stage loses 12-13 "
    "readings within 25% (docs/lab/2026-12-07-eta-below-far.md): the chain 3 times slower "
    "than the night before's reads -57% at 20%, -36% at 50%, -24% at 90%")


# The chain 1.5 times slower than the night before's (or the analysts 1.5 times quicker)
# reads -25% at 20%, on the edge, and within it after: not among the cases that miss.
ONE_STAGE_MISSES = [(k, moved) for k in BELOW_FAR for moved in ("chain", "analysts")
                    if (k, moved) not in ((1.5, "chain"), (1 / 1.5, "analysts"))]


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=ONE_STAGE)
@pytest.mark.parametrize(("k", "moved"), ONE_STAGE_MISSES,
                         ids=[f"{moved} {k:.3g}x" for k, moved in ONE_STAGE_MISSES])
def test_a_change_in_one_stage_is_priced_within_a_quarter_once_both_answered(
        sqlite_engine: Engine, k: float, moved: str) -> None:
    for f, left, found in replay(sqlite_engine, k, moved=moved):
        if f >= CHAIN_ANSWERED:
            assert found.eta_s is not None
            assert abs(found.eta_s - left) <= 0.25 * left, (f, found.eta_s, left)


def _eta_metrics(engine: Engine, at: datetime) -> dict[tuple[str, str], float]:
    """Return the ETA's samples of a scrape at ``at``: (metric, bound) -> value."""
    with time_machine.travel(at, tick=False):
        families = NightCollector(engine, load_settings()).collect()
    return {(sample.name, sample.labels.get("bound", "")): sample.value
            for family in families for sample in family.samples
            if sample.name.startswith("nightdesk_night_eta")}


def test_metrics_give_an_uncalibrated_range_no_interval_ends(sqlite_engine: Engine) -> None:
    # Every other face says "uncalibrated range"; /metrics gave its ends as `low`/`high`,
    # what a dashboard reads as the interval the replays held.
    night(sqlite_engine, 4, {n: v / 300 for n, v in TONIGHT.items()}, T0 - timedelta(days=1))
    batch_id, _ = night(sqlite_engine, 4, TONIGHT, T0, status="running")
    at = T0 + timedelta(seconds=0.5 * NIGHT_S)
    prog = nightstatus.progress(sqlite_engine, batch_id, at)
    assert prog.eta_level is None and prog.eta_low_s is not None  # a range, uncalibrated
    assert _eta_metrics(sqlite_engine, at) == {
        ("nightdesk_night_eta_seconds", "estimate"): prog.eta_s}


def test_metrics_give_a_calibrated_interval_with_its_level(sqlite_engine: Engine) -> None:
    night(sqlite_engine, 4, {n: v * 2 for n, v in TONIGHT.items()}, T0 - timedelta(days=1))
    batch_id, _ = night(sqlite_engine, 4, TONIGHT, T0, status="running")
    at = T0 + timedelta(seconds=0.5 * NIGHT_S)
    prog = nightstatus.progress(sqlite_engine, batch_id, at)
    assert _eta_metrics(sqlite_engine, at) == {
        ("nightdesk_night_eta_seconds", "estimate"): prog.eta_s,
        ("nightdesk_night_eta_seconds", "low"): prog.eta_low_s,
        ("nightdesk_night_eta_seconds", "high"): prog.eta_high_s,
        ("nightdesk_night_eta_interval_level", ""): eta.LEVEL}
