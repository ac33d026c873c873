"""How many tickers' chains a token budget keeps going at once, measured as the batch runs.

A moving mean of the tokens per active ticker (per chain, prefetching) divides the budget's
limit into chain slots (docs/architecture.md, "Tickers in flight follow the chains that
fit" and "Prefetching").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.traffic.gate import Gate
from app.traffic.ticket import Ticket

# Weight of a new reading in the mean: about 20 readings' memory (40 s at the default 2 s),
# long enough to smooth an analyst burst, short enough to follow prompts as chains grow.
WEIGHT = 0.05
# A relative change of the budget's tokens-per-byte estimate that starts the mean over.
RESEED = 0.10


@dataclass
class Footprint:
    """The moving mean of budget tokens one active ticker (or chain) keeps reserved or held;
    with ``chains_only`` (prefetching) only tickers whose chain was let in count, by their own."""

    weight: float = WEIGHT
    chains_only: bool = False
    per_ticker: float | None = field(init=False, default=None)
    readings: int = field(init=False, default=0)  # in the mean since it (re)started
    _ratio: float | None = field(init=False, default=None)  # the budget's, at its start
    _tickers: Footprint | None = field(init=False, default=None)  # before two steps are seen

    def __post_init__(self) -> None:
        if self.chains_only:
            self._tickers = Footprint(self.weight)

    def sample(self, gate: Gate, tickets: Iterable[Ticket]) -> None:
        """Take one reading's tokens per active ticker from ``gate``'s budget."""
        budget = gate.budget
        if budget is None:
            return
        tickets = list(tickets)
        ratio = budget.ratio()
        if self._ratio is not None and abs(ratio / self._ratio - 1) > RESEED:
            self.per_ticker, self.readings = None, 0  # costed another way: start over
        if self._tickers is not None:
            self._tickers.sample(gate, tickets)

        active = [t for t in tickets if (t.chained or not self.chains_only)
                  and (t.outstanding > 0 or t.hold > 0)]
        if not active:
            return
        if self.per_ticker is None:
            self._ratio = ratio
        tokens = (sum(t.reserved + t.hold for t in active) if self.chains_only
                  else budget.reserved + budget.held)
        now = tokens / len(active)
        self.readings += 1
        weight = max(self.weight, 1 / self.readings)
        self.per_ticker = now if self.per_ticker is None else (
            self.per_ticker + weight * (now - self.per_ticker))

    def tokens(self) -> float | None:
        """Return the tokens the cap divides by: per ticker, or per chain when prefetching."""
        if self._tickers is not None and self.per_ticker is None:
            return self._tickers.per_ticker  # no chain seen yet: the ticker mean stands in
        return self.per_ticker

    def slots(self, limit_tokens: int | None) -> int | None:
        """Return the tickers (chains) that fit ``limit_tokens`` at once (None: no cap yet)."""
        per = self.tokens()
        if limit_tokens is None or not per:
            return None
        return max(1, int(limit_tokens / per))


def prefetch_depth(slots: int, chains: int, chain: int) -> int:
    """Return how many tickers may be in their fan-out beside ``chains`` of ``slots``: the
    free slots, plus what keeps a full set of chains fed (a ticker spends about one step of
    its ``chain`` in its fan-out: ``slots`` chains need about ``slots / (chain - 1)`` tickers
    coming up behind them)."""
    return max(0, slots - chains) + max(1, math.ceil(slots / max(1, chain - 1)))
