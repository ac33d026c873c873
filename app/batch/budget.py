"""Budget the server's KV cache in tokens: admit a request only when its tokens fit.

Counting requests alone cannot keep a KV-limited server from preempting: an answer grows
after its request was admitted, so a cache that looked 80% full at admission overflows
later. The budget counts what each outstanding request can come to — its prompt tokens
(estimated from the prompt's bytes, the ratio learned from the server's own counts as the
batch runs) plus the output it is expected to produce (``max_tokens`` until the node has
shown its real lengths: then a high quantile of them, never more than ``max_tokens``),
rounded up to whole KV blocks — against the capacity the server reports
(``num_gpu_blocks × block_size`` of ``vllm:cache_config_info``), of which it fills
``fill``. The ``/metrics`` gauges correct it as the batch runs:

- a new preemption means the estimate let too much in: the budget shrinks by ``backoff``
  (and stays shrunk: a preemption recomputes a whole prefill);
- KV usage above what the outstanding requests were estimated at means they are larger
  than estimated (or someone else uses the server): the budget scales down by the ratio;
- counters going backwards mean the server restarted: the corrections start over (what
  was learned about prompt and output sizes stays true of the same model).

A ticker between two calls keeps the tokens of its last call as a *hold* until its next
call takes their place. Holds are not in the cache (a finished request's blocks are free to
evict), so they never stop a started ticker's request; they stop a *new* ticker from
starting in their room, so a chain's next call finds its context still in the server's
prefix cache: started chains continue before new ones start.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

# A message's chat-template tokens beyond its text (role markers, separators).
MESSAGE_OVERHEAD_TOKENS = 8


class BudgetGauges(Protocol):
    """The readings the budget needs (serving.metrics.MetricsSnapshot has them)."""

    kv_cache_usage: float
    preemptions_total: float
    generation_tokens_total: float


def prompt_bytes(body: dict[str, Any]) -> int:
    """Return the UTF-8 size of a chat body's message texts."""
    return sum(len(str(m.get("content", "")).encode()) for m in body.get("messages", []))


@dataclass
class TokenBudget:
    """Tokens reserved for outstanding requests (and holds) against the server's KV cache."""

    capacity: int | None = None  # KV tokens; None: unknown, the budget admits everything
    block_size: int = 16
    fill: float = 0.95  # share of the capacity that may be reserved
    overbook: float = 1.0  # start factor: > 1 admits past the capacity (expects slack)
    backoff: float = 0.8  # factor kept per new preemption
    out_quantile: float = 0.95
    min_samples: int = 5  # a node's outputs seen before its quantile replaces max_tokens
    tokens_per_byte: float = 0.5  # until the server's own counts are seen: generous
    reserved: int = field(init=False, default=0)  # outstanding requests' tokens
    held: int = field(init=False, default=0)  # tickers between calls
    factor: float = field(init=False)
    correction: float = field(init=False, default=1.0)
    reason: str = field(init=False, default="start")
    _outputs: dict[str, list[int]] = field(init=False, default_factory=lambda: defaultdict(list))
    _bytes_seen: int = field(init=False, default=0)
    _tokens_seen: int = field(init=False, default=0)
    _preemptions: float | None = field(init=False, default=None)
    _generated: float | None = field(init=False, default=None)
    _window_peak: int = field(init=False, default=0)  # most reserved since the last reading
    costs_admitted: int = field(init=False, default=0)
    requests_admitted: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.factor = self.overbook

    @property
    def known(self) -> bool:
        """Return True when the server's KV capacity is known (else nothing is budgeted)."""
        return bool(self.capacity)

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

    def ratio(self) -> float:
        """Return the tokens-per-byte estimate: the server's counts so far, else the default."""
        if self._bytes_seen and self._tokens_seen:
            # 5% over what was seen: a prompt's share of rarer words varies.
            return 1.05 * self._tokens_seen / self._bytes_seen
        return self.tokens_per_byte

    def expected_output(self, node: str, max_tokens: int) -> int:
        """Return the output to reserve: a high quantile of the node's outputs, else the max."""
        seen = self._outputs.get(node, [])
        if len(seen) < self.min_samples:
            return max_tokens
        ordered = sorted(seen)
        at = min(len(ordered) - 1, math.ceil(self.out_quantile * len(ordered)) - 1)
        return min(max_tokens, ordered[at])

    def cost(self, node: str, body: dict[str, Any]) -> int:
        """Return the tokens a request can come to in the cache, in whole blocks."""
        messages = body.get("messages", [])
        prompt = (math.ceil(prompt_bytes(body) * self.ratio())
                  + MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1))
        tokens = prompt + self.expected_output(node, int(body.get("max_tokens") or 0))
        return math.ceil(tokens / self.block_size) * self.block_size

    def fits(self, cost: int) -> bool:
        """Return True when a started ticker's request of ``cost`` tokens fits now.

        Holds do not count here: they are what keeps room for exactly these requests.
        With nothing outstanding anything fits: a request larger than the budget must
        still run (alone), or it would wait forever.
        """
        limit = self.limit
        if limit is None or self.reserved == 0:
            return True
        return self.reserved + cost <= limit

    def room_for_new(self) -> bool:
        """Return True when a new ticker may start: a typical request fits beside the holds."""
        limit = self.limit
        if limit is None or (self.reserved == 0 and self.held == 0):
            return True
        return self.reserved + self.held + self.typical_cost <= limit

    def take(self, cost: int, held: int = 0) -> None:
        """Reserve ``cost`` for a request, releasing its ticker's hold of ``held``."""
        self.held -= held
        self.reserved += cost
        self._window_peak = max(self._window_peak, self.reserved)
        self.costs_admitted += cost
        self.requests_admitted += 1

    def give_back(self, cost: int, hold: bool) -> int:
        """Release a finished request; keep its tokens as its ticker's hold when ``hold``.

        Returns the tokens now held for the ticker (0 when none).
        """
        self.reserved -= cost
        if hold:
            self.held += cost
            return cost
        return 0

    def drop_hold(self, held: int) -> None:
        """Release a finished ticker's hold."""
        self.held -= held

    def summary(self) -> dict[str, Any]:
        """Return what the budget knew and did, for the batch's log and the bench's JSON."""
        return {
            "kv_capacity_tokens": self.capacity, "fill": self.fill, "limit_tokens": self.limit,
            "factor": round(self.factor, 4), "correction": round(self.correction, 4),
            "tokens_per_byte": round(self.ratio(), 4), "reason": self.reason,
            "mean_request_tokens": self.typical_cost, "requests": self.requests_admitted,
            "expected_output": {node: self.expected_output(node, max(seen))
                                for node, seen in sorted(self._outputs.items())},
        }

    def learn(self, node: str, body: dict[str, Any], prompt_tokens: int,
              completion_tokens: int) -> None:
        """Learn from a finished request what its prompt and output really came to."""
        size = prompt_bytes(body)
        if size and prompt_tokens:
            self._bytes_seen += size
            self._tokens_seen += prompt_tokens
        if completion_tokens:
            self._outputs[node].append(completion_tokens)

    def set_capacity(self, capacity: int | None, block_size: int | None = None) -> None:
        """Take the server's KV capacity in tokens (and block size) from its cache config."""
        if capacity:
            self.capacity = capacity
        if block_size:
            self.block_size = block_size

    def observe(self, gauges: BudgetGauges) -> int | None:
        """Correct the budget from one metrics reading; return the new limit."""
        restarted = self._preemptions is not None and (
            gauges.preemptions_total < self._preemptions
            or (self._generated is not None and gauges.generation_tokens_total < self._generated)
        )
        new_preemptions = (0.0 if self._preemptions is None or restarted
                           else gauges.preemptions_total - self._preemptions)
        self._preemptions = gauges.preemptions_total
        self._generated = gauges.generation_tokens_total
        if restarted:
            self.factor, self.correction = self.overbook, 1.0
            self.reason = "server restarted"
        elif new_preemptions > 0:
            self.factor *= self.backoff
            self.reason = f"{new_preemptions:.0f} preemptions"
        # The reading was taken a moment ago: requests released since were still in it, so
        # compare with the most reserved since the previous reading, not with now.
        reserved = max(self.reserved, self._window_peak)
        self._window_peak = self.reserved
        if self.capacity and not restarted:
            used = gauges.kv_cache_usage * self.capacity
            # Usage above what we reserved: requests are larger than estimated (or the
            # server has other clients). Scale down so our reservations mean real tokens;
            # never above 1, since reservations exceeding use is the margin for growth.
            if reserved and used > reserved + self.block_size:
                self.correction = min(self.correction, reserved / used)
                self.reason = "kv usage above the estimate"
            else:
                # Estimates learned since (prompt ratio, output quantiles) are better: let
                # the correction ease back, a quarter of the way per reading.
                self.correction += 0.25 * (1.0 - self.correction)
        return self.limit
