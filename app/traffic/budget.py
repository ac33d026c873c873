"""Budget a server's KV cache in tokens: admit a request only when its tokens fit.

Each request reserves its prompt (estimated from its bytes) plus its expected output, in
whole KV blocks, against ``fill × factor × correction`` of the capacity the server reports;
the ``/metrics`` gauges move the factor and the correction (docs/architecture.md, "The token
budget"). Between two calls a ticker keeps its last call's tokens as a *hold*, which stops
new tickers, not its own next call ("Cache locality").
"""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app.promptsize import Counted, message_bytes
from serving.metrics import MetricsSnapshot

# A message's chat-template tokens beyond its text (role markers, separators).
MESSAGE_OVERHEAD_TOKENS = 8
# Factor changes kept from the start of a batch, and as many from its end.
TRAJECTORY_ENDS = 32
# Reservation changes remembered between two readings (a guard, never reached in practice).
HISTORY_MAX = 8192


@dataclass(frozen=True)
class Claim:
    """One request's reservation: its tokens in whole blocks, of which its expected output."""

    tokens: int
    output: int = 0
    settled: bool = True  # costed from what the server has shown, not from the defaults


def prompt_bytes(body: dict[str, Any]) -> int:
    """Return the UTF-8 size of a chat body's message texts."""
    return message_bytes(body.get("messages", []))


@dataclass
class TokenBudget:
    """Tokens reserved for outstanding requests (and holds) against the server's KV cache."""

    capacity: int | None = None  # KV tokens; None: unknown, the budget admits everything
    block_size: int = 16
    fill: float = 0.98  # share of the capacity that may be reserved
    overbook: float = 1.05  # start factor, > 1 past the capacity: spends ratio()'s 5% margin
    overbook_max: float = 1.5  # the most the factor rises to
    overbook_step: float = 0.02  # added per under-used reading
    rise_after: int = 3  # under-used readings in a row before the factor rises
    calm: int = 10  # readings after a preemption without a rise
    high_cut: float = 0.9  # factor kept when KV usage reaches kv_high (not below the start)
    kv_high: float = 0.90  # KV usage where the factor stops rising and overbooking is cut
    backoff: float = 0.8  # factor kept per new preemption
    out_quantile: float = 0.95
    min_samples: int = 5  # a node's outputs seen before its quantile replaces max_tokens
    tokens_per_byte: float = 0.5  # until the server's own counts are seen: generous
    clock: Callable[[], float] = time.time  # the clock of the readings' ``taken_at``
    # What the server's /tokenize counted: the ratio until a request finishes.
    counted: Counted | None = None
    reserved: int = field(init=False, default=0)  # outstanding requests' tokens
    held: int = field(init=False, default=0)  # tickers between calls
    factor: float = field(init=False)
    correction: float = field(init=False, default=1.0)
    reason: str = field(init=False, default="start")  # of the last change
    costs_admitted: int = field(init=False, default=0)
    requests_admitted: int = field(init=False, default=0)
    readings: int = field(init=False, default=0)
    peak_factor: float = field(init=False)
    rises: int = field(init=False, default=0)
    cuts: int = field(init=False, default=0)
    footprint_share: float | None = field(init=False, default=None)  # last measured
    # The answers' lengths seen, per node.
    outputs: dict[str, list[int]] = field(init=False, default_factory=lambda: defaultdict(list))
    _bytes_seen: int = field(init=False, default=0)
    _tokens_seen: int = field(init=False, default=0)
    _waiting: float | None = field(init=False, default=None)
    _window_peak: int = field(init=False, default=0)  # most reserved since the last reading
    _out: int = field(init=False, default=0)  # outstanding requests' expected output
    _generated_out: float = field(init=False, default=0.0)  # of which generated (estimate)
    _unsettled: int = field(init=False, default=0)  # outstanding requests costed by default
    # (time, reserved, output) after each change since the last reading, and before them.
    _history: deque[tuple[float, int, int]] = field(init=False, default_factory=deque)
    _base: tuple[int, int] = field(init=False, default=(0, 0))
    _refused: bool = field(init=False, default=False)  # held a request back since the reading
    _streak: int = field(init=False, default=0)
    _calm_left: int = field(init=False, default=0)
    # [reading, factor, correction, reason] at each change: the first and the last ones.
    trajectory: list[list[Any]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.overbook <= self.overbook_max:
            raise ValueError(f"overbook_max ({self.overbook_max}) must be at least overbook "
                             f"({self.overbook}), and both above 0")
        if not (0 < self.backoff < 1 and 0 < self.high_cut <= 1 and self.overbook_step >= 0):
            raise ValueError("budget_backoff must be in (0, 1), high_cut in (0, 1], "
                             "overbook_step at least 0")
        for name in ("fill", "kv_high", "out_quantile"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1] (got {getattr(self, name)})")
        for name, least in (("rise_after", 1), ("min_samples", 1), ("calm", 0)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be at least {least} (got {getattr(self, name)})")
        self.factor = self.peak_factor = self.overbook
        self.trajectory.append([0, round(self.factor, 4), 1.0, "start"])

    @property
    def limit(self) -> int | None:
        """Return the tokens that may be reserved now (None when the capacity is unknown)."""
        if not self.capacity:
            return None
        return int(self.capacity * self.fill * self.factor * self.correction)

    @property
    def free(self) -> int | None:
        """Return the tokens left to reserve (None when unknown)."""
        limit = self.limit
        return None if limit is None else limit - self.reserved - self.held

    @property
    def typical_cost(self) -> int:
        """Return the mean reservation of the requests admitted so far (0 before any)."""
        return self.costs_admitted // self.requests_admitted if self.requests_admitted else 0

    def _counts(self) -> tuple[int, int]:
        """Return the (bytes, tokens) the ratio is measured on: answers', else /tokenize's."""
        if self._bytes_seen and self._tokens_seen:
            return self._bytes_seen, self._tokens_seen
        return (self.counted.bytes, self.counted.tokens) if self.counted is not None else (0, 0)

    def ratio_known(self) -> bool:
        """Return True once prompts are costed by the server's counts, not the default."""
        return all(self._counts())

    def ratio(self) -> float:
        """Return the tokens-per-byte estimate: finished requests' counts, else ``counted``'s
        (the server's /tokenize), else the generous default."""
        seen_bytes, seen_tokens = self._counts()
        if seen_bytes and seen_tokens:
            # 5% over what was seen: a prompt's share of rarer words varies.
            return 1.05 * seen_tokens / seen_bytes
        return self.tokens_per_byte

    def expected_output(self, node: str, max_tokens: int) -> int:
        """Return the output to reserve: a high quantile of the node's outputs, else the max."""
        seen = sorted(self.outputs.get(node, []))
        if len(seen) < self.min_samples:
            return max_tokens
        at = min(len(seen) - 1, math.ceil(self.out_quantile * len(seen)) - 1)
        return min(max_tokens, seen[at])

    def claim(self, node: str, body: dict[str, Any]) -> Claim:
        """Return what a request can come to in the cache, in whole blocks, and its output."""
        prompt = (math.ceil(prompt_bytes(body) * self.ratio())
                  + MESSAGE_OVERHEAD_TOKENS * (len(body.get("messages", [])) + 1))
        output = self.expected_output(node, int(body.get("max_tokens") or 0))
        tokens = math.ceil((prompt + output) / self.block_size) * self.block_size
        settled = bool(self._tokens_seen) and len(self.outputs.get(node, [])) >= self.min_samples
        return Claim(tokens, output, settled)

    def fits(self, cost: int) -> bool:
        """Return True when a started ticker's request of ``cost`` tokens fits now: holds do not
        count (they keep room for such requests); with nothing outstanding anything fits."""
        limit = self.limit
        if limit is None or self.reserved == 0 or self.reserved + cost <= limit:
            return True
        self._refused = True
        return False

    def room_for_new(self, *, refusal: bool = True, starting: int = 0) -> bool:
        """Return True when a new ticker may start: a typical request fits beside the holds
        and one for each of ``starting`` tickers not costed yet; a no counts as a refusal
        (which lets the factor rise) unless ``refusal`` is False."""
        limit = self.limit
        fits = limit is None or (self.reserved == 0 and self.held == 0 and starting == 0) or (
            self.reserved + self.held + (starting + 1) * self.typical_cost <= limit)
        self._refused |= refusal and not fits
        return fits

    def take(self, claim: Claim, held: int = 0) -> None:
        """Reserve a request's tokens, releasing its ticker's hold of ``held``."""
        self.held -= held
        self.reserved += claim.tokens
        self._out += claim.output
        self._unsettled += not claim.settled
        self._window_peak = max(self._window_peak, self.reserved)
        self.costs_admitted += claim.tokens
        self.requests_admitted += 1
        self._remember()

    def give_back(self, claim: Claim, hold: bool) -> int:
        """Release a finished request, kept as its ticker's hold when ``hold``; return the hold."""
        self.reserved -= claim.tokens
        self._out -= claim.output
        self._unsettled -= not claim.settled
        self._remember()
        kept = claim.tokens if hold else 0
        self.held += kept
        return kept

    def learn(self, node: str, body: dict[str, Any], prompt_tokens: int,
              completion_tokens: int) -> None:
        """Learn from a finished request what its prompt and output really came to."""
        size = prompt_bytes(body)
        if size and prompt_tokens:
            self._bytes_seen += size
            self._tokens_seen += prompt_tokens
        if completion_tokens:
            self.outputs[node].append(completion_tokens)
            # Its tokens were counted into the generated part by the readings' deltas.
            self._generated_out -= completion_tokens

    def set_capacity(self, capacity: int | None, block_size: int | None = None) -> None:
        """Take the server's KV capacity in tokens (and block size) from its cache config."""
        if capacity:
            self.capacity = capacity
        if block_size:
            self.block_size = block_size

    def observe(self, gauges: MetricsSnapshot, *, preempted: float = 0.0, generated: float = 0.0,
                restarted: bool = False) -> int | None:
        """Correct the budget from one reading with ``preempted`` preemptions and ``generated``
        tokens since the last (``restarted``: a new server's); return the limit."""
        # Capped at their expected outputs: other clients' and retried attempts' tokens are in
        # the counter too, and are never learned back.
        self._generated_out = 0.0 if restarted else min(float(self._out),
                                                        self._generated_out + generated)
        waiting_grew = self._waiting is not None and gauges.waiting > self._waiting
        self._waiting = gauges.waiting
        refused, self._refused = self._refused, False
        at_reading = self._at_reading(gauges.taken_at)
        self.readings += 1
        calm, self._calm_left = self._calm_left, max(0, self._calm_left - 1)
        if restarted:
            self.factor, self.correction = self.overbook, 1.0
            self._streak = self._calm_left = 0
            self._note("server restarted")
        elif preempted > 0:
            self.factor *= self.backoff
            self._streak, self._calm_left = 0, self.calm
            self.cuts += 1
            self._note(f"{preempted:.0f} preemptions")
        # Requests released since the reading were still in it: compare with the window's peak.
        reserved = max(self.reserved, self._window_peak)
        self._window_peak = self.reserved
        if self.capacity and not restarted:
            used = gauges.kv_cache_usage * self.capacity
            # Usage above our reservations (larger requests, or other clients): scale them to
            # real tokens. Never above 1: only the factor may overbook.
            if reserved and used > reserved + self.block_size:
                if reserved / used < self.correction:
                    self.correction = reserved / used
                    self._note("kv usage above the estimate")
            else:
                # The estimates learned since are better: ease back a quarter per reading.
                self.correction += 0.25 * (1.0 - self.correction)
            if not preempted:
                self._steer(gauges, at_reading, refused=refused,
                            held_back=bool(calm) or waiting_grew)
        return self.limit

    def _steer(self, gauges: MetricsSnapshot, at_reading: tuple[int, int], *, refused: bool,
               held_back: bool) -> None:
        """Raise the factor while the footprint leaves room; cut it near a full cache."""
        assert self.capacity
        limit = self.limit or 0
        reserved, output = at_reading
        share = None
        if reserved and reserved >= limit / 2:  # too little reserved says little
            # The cache if every answer ran to its expected length at once: usage now, the
            # output still to come, and a typical request per queued one.
            to_come = output - min(max(self._generated_out, 0.0), float(output))
            footprint = (gauges.kv_cache_usage * self.capacity + to_come
                         + gauges.waiting * self.typical_cost)
            share = self.footprint_share = footprint / reserved
        if gauges.kv_cache_usage >= self.kv_high:
            self._streak = 0
            if self.factor > self.overbook:
                self.factor = max(self.overbook, self.factor * self.high_cut)
                self.cuts += 1
                self._note(f"kv usage {gauges.kv_cache_usage:.0%} at kv_high")
            return
        # The footprint may fill what exact estimates would at the start factor: share ×
        # factor × correction ≤ 1.
        if share is not None and self.factor > self.overbook and (
                share * self.factor * self.correction > 1):
            self.factor = max(self.overbook, 1 / (share * self.correction))
            self._streak = 0
            self.cuts += 1
            self._note(f"footprint {share:.2f} per reserved token: no room to overbook")
            return
        rise = min(self.overbook_max, self.factor + self.overbook_step)
        if (refused and share is not None and not held_back and not self._unsettled
                and rise > self.factor and share * rise * self.correction <= 1):
            self._streak += 1
            if self._streak >= self.rise_after:
                self.factor = rise
                self.rises += 1
                self._note(f"kv under-used: footprint {share:.2f} per reserved token")
        else:
            self._streak = 0

    def _remember(self) -> None:
        if len(self._history) >= HISTORY_MAX:
            self._history.clear()  # no readings come: the reservations' past is not needed
            self._base = (self.reserved, self._out)
        self._history.append((self.clock(), self.reserved, self._out))

    def _at_reading(self, taken_at: datetime | None) -> tuple[int, int]:
        """Return (reserved, expected output) as they stood when the reading was taken;
        without its time, the least reserved and the most output since the last reading
        (which can only understate the room to overbook)."""
        history, self._history = self._history, deque()
        if taken_at is None:
            states = [self._base, *((r, o) for _, r, o in history)]
            self._base = (self.reserved, self._out)
            return min(r for r, _ in states), max(o for _, o in states)
        moment = taken_at.timestamp()
        self._history.extend(h for h in history if h[0] > moment)  # for the next reading
        passed = [(r, o) for when, r, o in history if when <= moment]
        self._base = passed[-1] if passed else self._base
        return self._base

    def _note(self, reason: str) -> None:
        """Record a change of factor or correction: the reason, the peak, the trajectory."""
        self.reason = reason
        self.peak_factor = max(self.peak_factor, self.factor)
        self.trajectory.append(
            [self.readings, round(self.factor, 4), round(self.correction, 4), reason])
        if len(self.trajectory) > 2 * TRAJECTORY_ENDS:
            del self.trajectory[TRAJECTORY_ENDS]  # the oldest of the last ones
