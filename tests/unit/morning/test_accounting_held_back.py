"""What held a batch back: the cache, the server's slots, the client's cap, or the graph."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console
from sqlalchemy import Engine, update

from app.cli.report import held_back_by, render_table
from app.config import Settings
from app.db.batchsettings import BatchSettings
from app.db.models import Batch, ServerSample
from app.morning.accounting import batch_report
from app.morning.serverview import UNRECORDED, bounds, near, request_cap, server_view
from tests.unit.support.call_rows import T0, known_batch, new_batch


def reading(running: float, waiting: float = 0.0, kv: float = 0.3,
            preemptions: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(running=running, waiting=waiting, kv_cache_usage=kv,
                           preemptions_total=preemptions)


@pytest.mark.parametrize(("settings", "cap"), [
    ({"strategy": "sequential"}, 1),
    ({"strategy": "adaptive", "max_concurrency": 64}, 64),
    ({"strategy": "adaptive:tail=off", "max_concurrency": 256}, 256),
    ({"strategy": "adaptive:initial=8,maximum=8", "max_concurrency": 64}, 8),  # the knob wins
    ({"strategy": "adaptive"}, UNRECORDED),  # a batch from before the cap was recorded
    ({"strategy": "adaptive:maximum=8"}, 8),
    # A knob since removed: adaptive still, its cap unreadable, not "no cap".
    ({"strategy": "adaptive:budget=off", "max_concurrency": 64}, UNRECORDED),
    ({"strategy": "fixed-14"}, None),  # caps tickers, not requests
    ({"strategy": "fixed-all"}, None),
    ({"strategy": "flood"}, None),
])
def test_the_cap_a_batch_ran_under(settings: dict[str, Any], cap: int | None) -> None:
    assert request_cap(BatchSettings.read(settings)) == cap


def test_a_batch_records_its_adaptive_ceiling() -> None:
    assert Settings(max_concurrency=200).snapshot().max_concurrency == 200


@pytest.mark.parametrize(("cap", "at"), [(64, 61), (256, 243), (14, 13), (8, 7), (4, 3),
                                         (3, 3), (1, 1)])
def test_at_the_cap_means_within_five_percent(cap: int, at: int) -> None:
    assert near(cap) == at


def test_each_reading_is_given_to_the_first_bound_that_held_it() -> None:
    rows = [
        reading(0, 0),                    # idle: left out
        reading(30, kv=0.95),             # cache nearly full
        reading(30, kv=0.5, preemptions=2),   # a preemption since the last reading
        reading(32, waiting=5, kv=0.6, preemptions=2),  # the server's own slots are full
        reading(64),                      # at the client's cap of 64
        reading(61),                      # within 5% of it: successors on their way
        reading(60),                      # below every limit: the graph had no more ready
    ]
    assert bounds(rows, 64) == pytest.approx(
        {"kv": 2 / 6, "server": 1 / 6, "client": 2 / 6, "graph": 1 / 6})
    # Small caps are held exactly: running 2 under a cap of 3 is the graph's doing.
    assert bounds([reading(3), reading(2)], 3) == pytest.approx(
        {"kv": 0, "server": 0, "client": 0.5, "graph": 0.5})
    # No cap (flood): what is not cache or queue is the graph's.
    assert bounds([reading(64), reading(20, waiting=3)], None)["graph"] == pytest.approx(0.5)
    # An unrecorded cap: the client and the graph cannot be told apart, and the table says so.
    assert bounds([reading(64)], UNRECORDED) == {"kv": 0, "server": 0, "client_or_graph": 1.0}
    assert bounds([reading(0)], 64) == {}


def add_reading(engine: Engine, batch_id: int, at_s: float, running: float,
                kv: float, endpoint: str | None = None) -> None:
    with engine.begin() as conn:
        conn.execute(ServerSample.__table__.insert().values(  # type: ignore[attr-defined]
            batch_id=batch_id, sampled_at=T0 + timedelta(seconds=at_s), running=running,
            waiting=0.0, kv_cache_usage=kv, preemptions_total=0.0, prompt_tokens_total=0.0,
            generation_tokens_total=0.0, endpoint=endpoint))


def test_the_report_names_the_client_cap_when_the_server_had_room(
        sqlite_engine: Engine) -> None:
    # The shape of the 2026-12-01 night on one H200: 64 running for most of it, KV at most
    # 58%, nothing waiting.
    b = known_batch(sqlite_engine)
    with sqlite_engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == b).values(
            settings={"strategy": "adaptive", "max_concurrency": 64}))
    for i, (running, kv) in enumerate([(64, 0.4), (64, 0.5), (63, 0.58), (40, 0.2)]):
        add_reading(sqlite_engine, b, float(i), running, kv)
    view = server_view(sqlite_engine, b)
    assert (view.bound, view.request_cap) == ("client", 64)
    assert view.bound_shares == pytest.approx({"kv": 0, "server": 0, "client": 0.75,
                                               "graph": 0.25})
    console = Console(width=200, record=True)
    render_table(batch_report(sqlite_engine, b), view, console)
    assert ("the client's request cap (64 per endpoint; the server had room): 75% of busy "
            "readings") in console.export_text()


def test_several_endpoints_are_judged_each_against_its_own_cap(sqlite_engine: Engine) -> None:
    b = new_batch(sqlite_engine)
    with sqlite_engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.id == b).values(
            settings={"strategy": "adaptive", "max_concurrency": 8}))
    # Summed, 8 + 4 running would look over the cap; each endpoint alone: one at it, one not.
    for i in range(3):
        add_reading(sqlite_engine, b, float(i), 8, 0.3, endpoint="http://a/v1")
        add_reading(sqlite_engine, b, float(i), 4, 0.3, endpoint="http://b/v1")
    view = server_view(sqlite_engine, b)
    assert view.bound_shares == pytest.approx({"kv": 0, "server": 0, "client": 0.5,
                                               "graph": 0.5})
    assert server_view(sqlite_engine, b, "http://b/v1").bound == "graph"


def test_nothing_to_say_without_busy_readings(sqlite_engine: Engine) -> None:
    view = server_view(sqlite_engine, known_batch(sqlite_engine))
    assert (view.bound, view.bound_shares) == (None, None)
    assert held_back_by(view) == "—"
