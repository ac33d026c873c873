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

That mean still begins on the analysts: at a batch's start every ticker is in its fan-out,
four calls side by side (about 4,800 tokens a ticker on the H200 at 40 tickers, against
2,000-2,500 for a ticker early in its chain), and the cap came down to the chains' size one
ticker every 2-6 s; the batch's first 30 s ran 15% under a fixed setting's while the cache
stood 30-50% full. *Prefetching* (the default; ``adaptive:prefetch=off`` turns it off)
separates the two. The cap counts chains, not tickers: a ticker's first downstream call
waits for a chain slot (``Server.enter_chain``), and a new ticker may start its analysts
while fewer tickers are in their fan-out than the free chain slots plus the few a steady
batch needs to keep its chains fed (``prefetch_depth``). The analysts then fill the room the
chains leave (a 1,000-token analyst call decodes as much as a 3,000-token chain call in a
third of the cache), and a freed chain slot is taken by a ticker whose analysts are done.
Its downstream prompts open with its analysts' reports, not their prompts, so a wait there
costs no cached context. Tickers without such a fan-out (a chain only, or several samples
side by side) are chains from their first call and capped as tickers. The chain footprint is
then measured on chains only (each by its own reservation and hold); until a reading has
seen a chain, the ticker mean above stands in. A cohort of chains started together is small
at first and grows along the chains, so the cap lets more chains in early than can run at
once later; the budget's gate then holds their later calls (no preemption), and the cap lets
no new chain in until they shrink back. On a stepped model of the H200's server
(tests/unit/stepped_gpu.py) at the 40-ticker shape this ran 2-5% above the ticker cap and
2-4% above fixed-14 in every variant tried (with and without a prefix cache, several prefill
and batch costs); predicting a chain's mean size from its steps (tried, not kept) gained
1-2%: the room it kept for the cohort's growth was idle while the cohort was small. On the
H200 at 40 tickers (docs/performance.md, a fourth run) it ran 4.9% above the ticker cap and
level with fixed-14 (776.9 against 740.3 and 776.1 tok/s), with no preemption, its first 30
s at 1,301 tok/s against 939; the cohort it let in then grew as above (the cap at 28 chains
at 6 s, 22 chains in by 32 s, 14 of their calls held at the gate at 90 s), which is where
the rest of that run went.
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
    """The moving mean of budget tokens one active ticker (or chain) keeps reserved or held.

    With ``chains_only`` (prefetching) only tickers whose chain was let in count, each by
    its own reservation and hold.
    """

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

        def hold(t: Ticket) -> int:  # what it holds in this gate's budget between calls
            return t.hold if t.held_by in (None, gate) else 0

        def here(t: Ticket) -> bool:
            return t.outstanding > 0 or hold(t) > 0

        if self.chains_only:
            active = [t for t in tickets if t.chained and here(t)]
            if not active:
                return
            tokens = float(sum(t.reserved + hold(t) for t in active))
            count = len(active)
        else:
            count = sum(1 for t in tickets if here(t))
            if count == 0:
                return
            tokens = budget.reserved + budget.held
        if self.per_ticker is None:
            self._ratio = ratio
        now = tokens / count
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
    """Return how many tickers may be in their fan-out beside ``chains`` of ``slots``.

    The free slots, plus what keeps a full set of chains fed: a ticker spends about one
    step of its ``chain`` in its fan-out, so ``slots`` chains need about ``slots / (chain
    - 1)`` tickers coming up behind them.
    """
    return max(0, slots - chains) + max(1, math.ceil(slots / max(1, chain - 1)))
