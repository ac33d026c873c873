"""Choose the endpoint a ticker goes to: pure selection over what each endpoint has free.

Among the endpoints up, with room and under their share of the work left, the most free
budget tokens, then free request places, fewer tickers, list order (docs/architecture.md,
"Several endpoints").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """What routing sees of one endpoint at one moment."""

    index: int  # place in the configured list
    up: bool
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

    Endpoints that are down are passed over while any is up; when all are down, all
    qualify if ``down_if_all``. ``need_room`` False picks for a chain that must go on
    somewhere; ``exclude`` is never chosen; ``total_work`` (the batch's requests not yet
    finished) admits only endpoints under their share of it.
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
