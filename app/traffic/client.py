"""The one client a ticker's graph calls through: it owns each call, from fitting its prompt
and its server's gate to the answer, and sends it elsewhere when its server fails it.

A call is one loop (tenacity, ``Tries``): at each server it goes to, its prompt fitted to
that server's context (counted, no place held), then retries there, each at the gate, with
the backoff outside it; and, its retries spent on a server found down or restarted (or a
count failed there), the same call sent to one that is up, at most twice per endpoint; a
call moved while it waited at its gate is not counted (docs/architecture.md, "One health
rule").
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

import structlog

from agents.chat import CallTag, ChatResult
from agents.fitting import Prompt, PromptSize, Trim
from app.errors import (
    ContextLengthError,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMMalformedError,
    LLMStreamError,
    LLMTimeoutError,
)
from app.llm import Ask, Call, Tries
from app.tasks import beside
from app.traffic.budget import Claim
from app.traffic.gate import priority
from app.traffic.server import Server, ServerSet
from app.traffic.ticket import Ticket

log = structlog.get_logger(__name__)


class EndpointGone(LLMConnectionError):
    """The call's endpoint went down while the call waited or ran; it is sent elsewhere."""


def server_fault(error: LLMError) -> bool:
    """Tell whether a failed call says something about its server rather than the request."""
    if isinstance(error, ContextLengthError):
        return False
    if isinstance(error, LLMHTTPError):
        return error.http_status is None or error.http_status >= 500
    return isinstance(error, LLMConnectionError | LLMStreamError | LLMTimeoutError
                      | LLMMalformedError)


class TickerClient:
    """A ticker's calls, each through its server's gate (chain slot, budget claim, a place
    per attempt) and one ``TrackedLLM.attempt`` per try; the ticker's progress is kept on
    its ``ticket``, which only this client and its gate write."""

    def __init__(self, servers: ServerSet, server: Server, ticket: Ticket) -> None:
        self.servers = servers
        self.server = server
        self.ticket = ticket
        server.arrive(ticket)
        server.started += 1

    def close(self) -> None:
        """Release what the ticker still holds: its work is over (again: nothing to do)."""
        ticket = self.ticket
        if ticket.finished:
            return
        # Requests it did not make (a failure cut it short) are no longer work left.
        ticket.done = max(ticket.done, ticket.requests)
        ticket.asked = True
        for server in self.servers:
            server.gate.drop_hold(ticket)
        self.server.leave(ticket)
        self.servers.changed.set()

    async def chat(self, tag: CallTag, prompt: Prompt, *, max_tokens: int,
                   response_format: dict[str, Any] | None = None) -> ChatResult:
        """Make one call of a node's (agents.chat.ChatClient): ``send`` it as an ``Ask``."""
        return await self.send(tag, Ask(prompt, max_tokens, response_format))

    async def send(self, tag: CallTag, asked: Ask | dict[str, Any]) -> ChatResult:
        """Send ``asked`` (a node's ``Ask``, fitted at each server first; a replay's body as it
        is) as one call, on its server and on another when that one fails it; raise the last
        attempt's LLMError (ServerBusy once back-pressure outlasted the outage budget)."""
        # A server that keeps flapping must not keep one call going round for ever.
        call, tries = Call(), Tries(self.server.llm.settings, sends_left=2 * len(self.servers))
        at: Server | None = None  # where the call is fitted and claimed
        ready: datetime | None = None  # fitted: a wait from here on is ours
        claim, rank, started = Claim(0), 0, 0.0
        try:
            async for attempt in tries.retrying(tag, call):
                with attempt:
                    server = self._here()
                    if server is not at:  # the call's first attempt here: fit, claim tokens
                        body, trimmed = await self._fit(server, tag, tries, asked)
                        ready = ready or datetime.now(UTC)
                        claim, started = await self._claim(server, tag, body)
                        at, rank = server, priority(self.ticket)
                        tries.resend()
                    made = call.attempts
                    try:
                        result = await self._unless_gone(server, self._attempt(
                            server, claim, tag, call, body, rank, ready, trimmed))
                    except LLMError as error:
                        if isinstance(error, EndpointGone) or not tries.note(error):
                            tries.due = False
                            # Moved before it went out, it cannot be what took its server
                            # down; the outage budget bounds such moves, the cap the rest.
                            if call.attempts > made:
                                tries.sends_left -= 1
                            if await self._resend(server, started, error, tries.sends_left,
                                                  tag):
                                tries.resend()
                        raise
        except LLMError as error:
            busy = tries.verdict(error, server.llm.endpoint)
            if busy is error:
                raise
            raise busy from error
        finally:
            self.ticket.done += 1
        server.gate.learn(tag.node, body, result)
        return result

    async def _fit(self, server: Server, tag: CallTag, tries: Tries,
                   asked: Ask | dict[str, Any]) -> tuple[dict[str, Any], Trim | None]:
        """Return the body ``asked`` sends at ``server`` and what its prompt left out; the
        prompt's counts need no place at the gate (they are no request). A count its server
        fails is a send, as a failed attempt is: moved, the call is fitted afresh where it
        goes (raised); past the cap the call fails, as it would; the count's own failure, or
        no server to take it, leaves the prompt uncounted: it goes as it is."""
        async def measure(messages: list[dict[str, str]], *, max_tokens: int,
                          exact: bool = False) -> PromptSize | None:
            started = server.clock()
            try:
                return await server.llm.size(messages, max_tokens=max_tokens, exact=exact)
            except LLMError as error:
                tries.sends_left -= 1
                if tries.sends_left <= 0 and server_fault(error):
                    tries.due = False
                    raise  # sent uncounted, a prompt too long would fail as the ticker's own
                if await self._resend(server, started, error, tries.sends_left):
                    tries.resend()
                    raise
                log.warning("prompt could not be counted", error=str(error)[:200])
                return None

        return (asked, None) if isinstance(asked, dict) else await server.llm.fitted(
            tag, asked, measure)

    async def _claim(self, server: Server, tag: CallTag,
                     body: dict[str, Any]) -> tuple[Claim, float]:
        """Enter ``server`` for a call: its chain slot (prefetching), then its budget claim;
        return the claim and when the call began there (on the clock readings fail on)."""
        ticket = self.ticket
        for other in self.servers:
            if other is not server:
                other.gate.release_hold(ticket)  # its context is in another replica's cache
        if server.strategy.prefetch and not ticket.chained:
            # Outside the attempt: a wait for a chain slot is not an attempt at the server.
            ticket.chained = await server.enter_chain(ticket)
        started = server.clock()
        claim = await server.gate.claim(tag.node, body)
        if not ticket.asked:
            ticket.asked = True
            self.servers.changed.set()  # its promised request is now the gate's own
        return claim, started

    async def _attempt(self, server: Server, claim: Claim, tag: CallTag, call: Call,
                       body: dict[str, Any], rank: int, ready: datetime | None,
                       trimmed: Trim | None) -> ChatResult:
        """Make one attempt with a place at ``server``'s gate; after a server fault, take a
        reading: a server found down holds its gate, so the next attempt waits there. A
        ``Retry-After`` pauses the gate for every call."""
        try:
            async with server.gate.slot(self.ticket, claim):
                return await server.llm.attempt(tag, call, body, priority=rank,
                                                ready_at=ready, trimmed=trimmed)
        except LLMError as error:
            if (isinstance(error, LLMHTTPError) and error.back_pressure
                    and error.retry_after_s is not None):
                server.gate.asked_to_wait(min(error.retry_after_s,
                                              server.llm.settings.calls.retry_wait_max_s))
            if server_fault(error):
                await server.check()
            raise

    async def _resend(self, endpoint: Server, started: float, error: LLMError,
                      tries_left: int, tag: CallTag | None = None) -> bool:
        """Move the ticker to where a call (``tag``) or its prompt's count that failed at
        ``endpoint`` goes next; False: the failure is its own, or no try is left
        (ServerSet.after_failure decides the rest)."""
        target = None if not server_fault(error) or tries_left <= 0 else (
            await self.servers.after_failure(
                endpoint, started, reached=not isinstance(error, LLMConnectionError)))
        if target is None:
            return False
        if tag is not None:
            log.warning("call sent again", node=tag.node, ticker=tag.ticker,
                        failed_at=endpoint.name, to=target.name, error=str(error)[:200])
        self._move(target)
        return True

    def _here(self) -> Server:
        """Return the ticker's endpoint, moving the ticker first when that one is down."""
        if not self.server.up:
            target = self.servers.alternative(self.server)
            if target is not None:
                self._move(target)
        return self.server

    def _move(self, target: Server) -> None:
        if target is self.server:
            return  # already there: another of its calls (samples, analysts) moved it
        log.warning("ticker moved", frm=self.server.name, to=target.name,
                    order=self.ticket.order)
        self.server.gate.release_hold(self.ticket)
        self.server.leave(self.ticket)
        self.server.moved_out += 1
        target.arrive(self.ticket)
        target.moved_in += 1
        self.server = target
        self.servers.changed.set()

    async def _unless_gone(self, endpoint: Server,
                           call: Coroutine[Any, Any, ChatResult]) -> ChatResult:
        """Await the call; if its endpoint goes down first and another is up, cancel it."""
        if not self.servers.several:
            return await call  # one endpoint: nowhere to go, so nothing to watch
        watches: list[asyncio.Task[None]] = []
        async with beside(lambda: [watch.cancel() for watch in watches]) as group:
            watches.append(group.create_task(_gone(self.servers, endpoint)))
            return await call


async def _gone(servers: ServerSet, endpoint: Server) -> None:
    """Raise EndpointGone once ``endpoint`` is down and another server is up to take over."""
    while endpoint.up or servers.alternative(endpoint) is None:
        await servers.health_event().wait()  # set when an endpoint goes down or comes back
    raise EndpointGone(f"{endpoint.name} went down during the call")
