"""A ticker's place in line and the work it has left: what every layer of traffic reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Ticket:
    """One ticker's place in line and the work it has left, as the scheduler sees it.

    ``order`` is the ticker's start order (its priority while it is not ``urgent``, which
    the scheduler's tail rule marks); ``requests`` and ``chain`` are its expected requests
    and the longest run of them that must go one after another (0 when unknown).
    """

    order: int
    requests: int = 0
    chain: int = 0
    done: int = 0
    outstanding: int = 0  # its requests holding a place now
    reserved: int = 0  # budget tokens of those requests
    hold: int = 0  # budget tokens kept between two of its calls, at its server's gate
    finished: bool = False
    chained: bool = False  # its chain was let in (app/traffic/chains.py, prefetching)
    urgent: bool = False  # its remaining chain would outlast the batch: served first
    asked: bool = False  # its first request asked for a place (or its work ended)

    @property
    def remaining(self) -> int:
        return max(0, self.requests - self.done)

    @property
    def fan_out(self) -> int:
        """Return the requests side by side before its chain (0: no fan-out of one sample's
        shape; a wider one is several samples, whose chains overlap)."""
        width = self.requests - self.chain + 1
        return width if self.chain > 0 and 1 < width <= self.chain else 0

    @property
    def fanning(self) -> bool:
        """Return True while its chain has not been let in: in its fan-out, or waiting."""
        return self.fan_out > 0 and not self.chained and not self.finished

    @property
    def remaining_chain(self) -> int:
        # The graph fans out first, so what is left is at most the chain.
        return min(self.remaining, self.chain)
