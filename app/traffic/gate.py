"""Hold LLM requests at a server's limits, serving the most senior waiter first."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agents.chat import ChatResult
from app.errors import LLMError
from app.promptsize import PromptCounter
from app.traffic.budget import Claim, TokenBudget
from app.traffic.clock import Clock, loop_clock
from app.traffic.holdback import HELD, QUEUED, REQUEST_LIMIT, TOKEN_BUDGET
from app.traffic.ticket import Ticket

# Above any batch's ticker count: an urgent ticker's priority sorts below every start order.
URGENT_STEP = 1 << 20
NO_TOKENS = Claim(0)  # what a request claims of no budget


def priority(ticket: Ticket | None) -> int:
    """Return a request's priority, lower first: its ticker's start order, and before all of
    those the urgent ones, longest remaining chain first."""
    if ticket is None:
        return 0
    if not ticket.urgent:
        return ticket.order
    return ticket.order - (1 + ticket.remaining_chain) * URGENT_STEP


class Gate:
    """Allow at most ``limit`` requests outstanding, waiters served by ``priority(ticket)``.

    With a token ``budget`` a request also needs its tokens free; the first in line waits
    for them and nobody passes it, so a chain's growing prompt is not starved. The gate
    costs each request (``claim``) and tells the budget what the answer cost (``learn``).
    """

    def __init__(self, limit: int, budget: TokenBudget | None = None, *,
                 changed: asyncio.Event | None = None,
                 counter: PromptCounter | None = None, clock: Clock = loop_clock) -> None:
        self.limit = max(1, limit)  # changed through set_limit, which lets waiters in
        self.budget = budget
        self._counter = counter  # the server's /tokenize, for the first prompt's cost
        self._first_count: asyncio.Event | None = None  # asked; set once it is over
        self.outstanding = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None], Claim, Ticket | None]] = []
        self._seq = itertools.count()
        # Set whenever room may have come; shared by a batch's gates, to wait for any of them.
        self.changed = changed or asyncio.Event()
        self._held_for: set[str] = set()  # why nothing is let through now (server down, stopping)
        self.holds: dict[int, int] = {}  # budget tokens a ticker keeps here, by start order
        self._closed: BaseException | None = None
        self._clock = clock
        # Until when the server asked every request to wait (its Retry-After), on ``clock``.
        self.quiet_until = float("-inf")

    @property
    def held(self) -> bool:
        return bool(self._held_for) or self._closed is not None

    def hold(self, why: str) -> None:
        """Let nothing new through until ``release(why)``; requests at the server go on."""
        self._held_for.add(why)
        self.changed.set()

    def release(self, why: str) -> None:
        self._held_for.discard(why)
        self.grant()

    def close(self, error: BaseException) -> None:
        """Refuse every waiting and later request with ``error``; the batch is stopping."""
        self._closed = error
        for _, _, future, _, _ in self._waiters:
            if not future.done():
                future.set_exception(self._refusal())
        self._waiters.clear()
        self.changed.set()

    def _refusal(self) -> BaseException:
        # A fresh exception per waiter: one instance raised in many tasks mixes tracebacks.
        assert self._closed is not None
        return type(self._closed)(*self._closed.args)

    async def drained(self) -> None:
        """Return once no request holds a place (none is at the server)."""
        while self.outstanding > 0:
            self.changed.clear()
            await self.changed.wait()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w[2].done())

    def set_limit(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.grant()

    def has_room(self, starting: int = 0) -> bool:
        """Return True when a new request (of a typical size) would be sent at once, beside
        one for each of ``starting`` tickers started here that have not asked yet."""
        return self.short(refusal=True, starting=starting) is None

    def short(self, *, refusal: bool = False, starting: int = 0) -> str | None:
        """Return what a new request of a typical size lacks first (None: it would go now),
        ``starting`` requests promised ahead of it; ``refusal`` counts a budget refusal
        (letting the factor rise), a report does not."""
        if self.held:
            return HELD
        if self.outstanding + starting >= self.limit:
            return REQUEST_LIMIT
        if self.waiting:
            return QUEUED
        if self.budget is not None and not self.budget.room_for_new(refusal=refusal,
                                                                    starting=starting):
            return TOKEN_BUDGET
        return None

    @property
    def closed(self) -> bool:
        """Return True once every request is refused (the batch is stopping)."""
        return self._closed is not None

    async def claim(self, node: str, body: dict[str, Any]) -> Claim:
        """Return what a request reserves of the budget (nothing without one); the server's
        first prompt is counted by its /tokenize first, once, while the claims made meanwhile
        wait for it, then go on in one loop turn, so none is costed at the default ratio (a
        failed count is left to the call)."""
        budget, counter = self.budget, self._counter
        if budget is None:
            return NO_TOKENS
        if counter is not None and counter.supported and not budget.ratio_known():
            if self._first_count is None:
                self._first_count = asyncio.Event()
                try:
                    with contextlib.suppress(LLMError):
                        await counter.count(counter.settings.llm.model, body["messages"])
                finally:
                    self._first_count.set()
            await self._first_count.wait()
        return budget.claim(node, body)

    def learn(self, node: str, body: dict[str, Any], result: ChatResult) -> None:
        """Tell the budget what a finished request's prompt and answer came to."""
        if self.budget is not None:
            self.budget.learn(node, body, result.prompt_tokens, result.completion_tokens)

    def _fits(self, claim: Claim) -> bool:
        return self.budget is None or self.budget.fits(claim.tokens)

    def _take(self, claim: Claim, ticket: Ticket | None) -> None:
        self.outstanding += 1
        if ticket is not None:
            ticket.outstanding += 1
            ticket.reserved += claim.tokens
        if self.budget is not None:
            # Its hold here becomes the request's (its client releases one elsewhere).
            held = self.holds.pop(ticket.order, 0) if ticket is not None else 0
            self.budget.take(claim, held)
            if ticket is not None and held:
                ticket.hold = 0

    def asked_to_wait(self, seconds: float) -> None:
        """Note a ``Retry-After``: no request takes a place here until it has passed.
        Back-pressure is the server's, not one call's, so every call waits it out."""
        self.quiet_until = max(self.quiet_until, self._clock() + seconds)

    @asynccontextmanager
    async def slot(self, ticket: Ticket | None = None,
                   claim: Claim = NO_TOKENS) -> AsyncIterator[None]:
        """Hold one place (and ``claim``'s tokens of the budget) for the duration of the
        block, once the server's last ``Retry-After`` has passed."""
        delay = self.quiet_until - self._clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if self._closed is not None:
            raise self._refusal()
        if (not self.held and self.outstanding < self.limit and self.waiting == 0
                and self._fits(claim)):
            self._take(claim, ticket)
        else:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiters,
                           (priority(ticket), next(self._seq), future, claim, ticket))
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._release(claim, ticket)  # granted just as we were cancelled
                raise
        try:
            yield
        finally:
            self._release(claim, ticket)

    def _release(self, claim: Claim, ticket: Ticket | None) -> None:
        self.outstanding -= 1
        if ticket is not None:
            ticket.outstanding -= 1
            ticket.reserved -= claim.tokens
        if self.budget is not None:
            # Its context stays cached for its next call: no new ticker may take its tokens.
            keep = (ticket is not None and ticket.outstanding == 0
                    and ticket.remaining > 1 and not ticket.finished)
            held = self.budget.give_back(claim, hold=keep)
            if ticket is not None and keep:
                self.holds[ticket.order] = ticket.hold = held
        self.grant()

    def release_hold(self, ticket: Ticket) -> None:
        """Give back a ticker's hold on this gate's budget, if it has one here: its context
        is not wanted here (it moved, waits for a chain slot, or ended)."""
        held = self.holds.pop(ticket.order, 0)
        if self.budget is not None and held:
            self.budget.held -= held
            ticket.hold = 0
            self.grant()

    def drop_hold(self, ticket: Ticket) -> None:
        """Release a ticker's hold here: it has no call left to send."""
        ticket.finished = True
        self.release_hold(ticket)

    def reorder(self) -> None:
        """Sort the waiters again by their tickets' priority now: a waiter's place was its
        priority when it queued, and a ticker the tail rule marked urgent since must not stay
        behind the start order (docs/architecture.md, "Order")."""
        self._waiters = [(priority(ticket), seq, future, claim, ticket)
                         for _, seq, future, claim, ticket in self._waiters if not future.done()]
        heapq.heapify(self._waiters)
        self.grant()

    def grant(self) -> None:
        """Let through the waiters that now fit, in order (also after the budget changed)."""
        while self._waiters and self.outstanding < self.limit and not self.held:
            _, _, future, claim, ticket = self._waiters[0]
            if future.done():
                heapq.heappop(self._waiters)
                continue
            if not self._fits(claim):
                break  # the first in line waits for its tokens; nobody passes it
            heapq.heappop(self._waiters)
            self._take(claim, ticket)
            future.set_result(None)
        self.changed.set()
