"""Choose an endpoint for a ticker: the pure rule, on loads whose answer is known."""

from __future__ import annotations

from app.batch.routing import Load, choose


def load(index: int, *, up: bool = True, room: bool = True, tokens: int | None = 1_000,
         requests: int = 4, tickers: int = 0) -> Load:
    return Load(index, up, room, tokens, requests, tickers)


def test_the_most_free_budget_tokens_win() -> None:
    assert choose([load(0, tokens=5_000), load(1, tokens=9_000), load(2, tokens=7_000)]) == 1


def test_a_larger_replica_with_more_free_tokens_wins_over_fewer_tickers() -> None:
    busy_big = load(0, tokens=40_000, tickers=6)
    idle_small = load(1, tokens=10_000, tickers=0)
    assert choose([busy_big, idle_small]) == 0


def test_without_every_budget_known_free_request_places_decide() -> None:
    # Endpoint 0 reports no KV capacity: tokens cannot be compared, request places can.
    assert choose([load(0, tokens=None, requests=9), load(1, tokens=50_000, requests=2)]) == 0


def test_ties_go_to_fewer_tickers_then_to_the_list_order() -> None:
    assert choose([load(0, tickers=3), load(1, tickers=1)]) == 1
    assert choose([load(0), load(1)]) == 0


def test_an_endpoint_without_room_is_passed_over_unless_room_is_not_needed() -> None:
    loads = [load(0, room=False, tokens=9_000), load(1, tokens=1_000)]
    assert choose(loads) == 1
    assert choose(loads, need_room=False) == 0
    assert choose([load(0, room=False), load(1, room=False)]) is None


def test_a_down_endpoint_gets_no_ticker_while_another_is_up() -> None:
    loads = [load(0, up=False, tokens=90_000), load(1, tokens=1_000)]
    assert choose(loads) == 1
    # ... even when the one that is up has no room: the ticker waits for it.
    assert choose([load(0, up=False), load(1, room=False)]) is None


def test_when_all_are_down_they_all_qualify_as_one_down_server_did() -> None:
    loads = [load(0, up=False, tokens=1_000), load(1, up=False, tokens=2_000)]
    assert choose(loads) == 1
    # A moved chain never goes from one down endpoint to another.
    assert choose(loads, need_room=False, exclude=1, down_if_all=False) is None


def test_a_moved_ticker_goes_to_the_best_other_endpoint_that_is_up() -> None:
    loads = [load(0, tokens=90_000), load(1, tokens=1_000), load(2, up=False, tokens=50_000)]
    assert choose(loads, need_room=False, exclude=0, down_if_all=False) == 1
