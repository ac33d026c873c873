"""How many tickers' chains a token budget keeps going at once, measured as the batch runs.

A ticker is 17 calls: four analysts side by side, then a chain of calls one after another
whose prompts grow with the debate. The gate admits *requests*, and a new ticker starts
whenever a request would be sent at once; early in a batch the calls are small (analysts,
the first steps of each chain), so the budget has room for many, and tickers start that the
cache cannot hold once their prompts have grown. Measured on an H200 at 40 tickers
(docs/performance.md): adaptive had all 40 started within 38 s while the budget fitted
about 17 requests, so 23 chains at a time waited at the gate between calls, each ticker took
177 s (median) against fixed-14's 84 s, and the batch ended on a tail of stragglers.

The cure counts tickers, not requests: each reading takes the tokens reserved and held for
tickers that have a call admitted or a hold (``Footprint.sample``), per such ticker, and
keeps a moving mean of it. A new ticker starts only while the tickers in flight are fewer
than the budget's limit divided by that mean (``Footprint.slots``), so every chain started
can send its next call at once while its context is still in the server's cache. Tickers
waiting at the gate are not in the mean (they reserve nothing, and counting them would
let an overshoot justify itself). Until a reading has seen a ticker, nothing is capped.

The mean is in the budget's tokens, so it must not outlive the budget's way of costing a
prompt. On the H200 again, the first readings costed prompts at the default 0.5 tokens per
byte and the server's counts then gave 0.226: a mean that kept 20 readings' memory of
the 2.3x costs let one ticker start every 4 s, and the batch took 100 s to reach the 14
chains a fixed setting started at once. So when the tokens-per-byte estimate moves by
more than ``RESEED``, the mean starts over; and each mean begins as a plain average of
its readings (weight 1/n) until that is lighter than ``weight``, so no single early
reading sets it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from app.batch.gate import Gate, Ticket

# Weight of a new reading in the mean: about 20 readings' memory (40 s at the default 2 s),
# long enough to smooth an analyst burst, short enough to follow prompts as chains grow.
WEIGHT = 0.05
# A relative change of the budget's tokens-per-byte estimate that starts the mean over.
RESEED = 0.10


@dataclass
class Footprint:
    """The moving mean of budget tokens one active ticker keeps reserved or held."""

    weight: float = WEIGHT
    per_ticker: float | None = field(init=False, default=None)
    readings: int = field(init=False, default=0)  # in the mean since it (re)started
    _ratio: float | None = field(init=False, default=None)  # the budget's, at its start

    def sample(self, gate: Gate, tickets: Iterable[Ticket]) -> None:
        """Take one reading's tokens per active ticker from ``gate``'s budget."""
        budget = gate.budget
        if budget is None:
            return
        ratio = budget.ratio()
        if self._ratio is not None and abs(ratio / self._ratio - 1) > RESEED:
            self.per_ticker, self.readings = None, 0  # costed another way: start over
        active = sum(1 for t in tickets
                     if t.outstanding > 0 or (t.hold > 0 and t.held_by in (None, gate)))
        if active == 0:
            return
        if self.per_ticker is None:
            self._ratio = ratio
        now = (budget.reserved + budget.held) / active
        self.readings += 1
        weight = max(self.weight, 1 / self.readings)
        self.per_ticker = now if self.per_ticker is None else (
            self.per_ticker + weight * (now - self.per_ticker))

    def slots(self, limit_tokens: int | None) -> int | None:
        """Return the tickers whose chains fit ``limit_tokens`` at once (None: no cap yet)."""
        if limit_tokens is None or not self.per_ticker:
            return None
        return max(1, int(limit_tokens / self.per_ticker))
