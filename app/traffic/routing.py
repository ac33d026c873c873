"""Choose the endpoint a ticker goes to: pure selection over what each endpoint has free.

A ticker's whole chain goes to one endpoint, so its shared prompt prefix stays in that
replica's prefix cache. The choice is made when the ticker starts (and again only when its
endpoint goes away): among the endpoints that are up and have room for a new ticker, the
one with the most free KV tokens in its token budget (app/traffic/budget.py). Free tokens
measure what an endpoint can still take: a slower replica holds its reservations longer,
so it has fewer free and is offered fewer tickers; a larger one has more. Where some
endpoint's budget is unknown (no KV capacity reported, or a strategy without a budget),
free request places decide, then the fewest tickers in flight, then the list order.

So that the endpoints finish together, a new ticker also needs its endpoint under its
share of the batch's remaining work: the requests not yet finished (started or not),
split in proportion to the endpoints' KV capacities (why: docs/architecture.md, "Several
endpoints"). The shares add up to all the work left and the work routed is less, so some
endpoint is always under its share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """What routing sees of one endpoint at one moment."""

    index: int  # place in the configured list
    up: bool  # its /metrics answers (or failed for less than the grace)
    room: bool  # it would take a new ticker now (gate room, or a free ticker slot)
    free_tokens: int | None  # its token budget's free tokens; None when it has no budget
    free_requests: int  # request places under its admission limit not in use
    tickers: int  # tickers whose calls go there now
    work: int = 0  # requests its tickers have left
    weight: float = 1.0  # its share of the work: its KV capacity (1.0 each when unknown)


def under_share(loads: Sequence[Load], total_work: int) -> list[Load]:
    """Return the loads whose routed work is under their share of ``total_work``."""
    weights = sum(load.weight for load in loads)
    if weights <= 0:
        return list(loads)
    return [load for load in loads if load.work < total_work * load.weight / weights]


def choose(loads: Sequence[Load], *, need_room: bool = True, exclude: int | None = None,
           down_if_all: bool = True, total_work: int | None = None) -> int | None:
    """Return the index of the endpoint to use, or None when none qualifies.

    Endpoints that are down are passed over while any is up; when all are down and
    ``down_if_all``, all qualify, so a batch behaves as it does with one server that is
    down (its calls fail, as they always did). ``need_room`` False picks for a chain that
    must go on somewhere (a moved ticker); ``exclude`` names an endpoint not to choose.
    ``total_work`` (the batch's requests not yet finished) turns on the fair-share rule
    for a new ticker: only endpoints under their share of it qualify.
    """
    pool = [load for load in loads if load.index != exclude]
    up = [load for load in pool if load.up]
    pool = up or (pool if down_if_all else [])
    if total_work is not None and len(pool) > 1:
        pool = under_share(pool, total_work)
    if need_room:
        pool = [load for load in pool if load.room]
    if not pool:
        return None
    tokens_known = all(load.free_tokens is not None for load in pool)

    def key(load: Load) -> tuple[int, int, int, int]:
        tokens = load.free_tokens if tokens_known and load.free_tokens is not None else 0
        return (tokens, load.free_requests, -load.tickers, -load.index)

    return max(pool, key=key).index
