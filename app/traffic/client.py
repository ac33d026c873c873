"""The one client a ticker's graph calls through: its server's gate and budget on every call.

A server fault asks for a reading; a server found down holds its gate, where the next
attempt waits, and its ticker continues on one that is up. Only the call cut short is sent
again, at most twice per endpoint (docs/architecture.md, "One health rule").
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import structlog

from agents.chat import CallTag, ChatResult
from agents.fitting import PromptSize
from app.errors import (
    ContextLengthError,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMMalformedError,
    LLMStreamError,
    LLMTimeoutError,
)
from app.llm import Admit, Call, TrackedLLM
from app.traffic.budget import Claim
from app.traffic.gate import priority
from app.traffic.server import Server, ServerSet
from app.traffic.tasks import first_error
from app.traffic.ticket import Ticket

log = structlog.get_logger(__name__)

# (client, priority, the call, the endpoint's admission of each attempt) -> result
Send = Callable[[TrackedLLM, int, Call, Admit], Awaitable[ChatResult]]


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
    """A ticker's calls through its server's gate (chain slot, budget claim, a place per
    attempt) and TrackedLLM; the call's progress is kept on its ``ticket``."""

    def __init__(self, servers: ServerSet, server: Server, ticket: Ticket) -> None:
        self.servers = servers
        self.server = server
        self.ticket = ticket
        server.arrive(ticket)
        server.started += 1

    async def measure(self, messages: list[dict[str, str]], *, max_tokens: int,
                      exact: bool = False) -> PromptSize | None:
        """Count a prompt for the context guard; not a request, so it needs no place.

        A count that fails for a server fault goes where a failed call would (``_routed``):
        to a server that is up, waiting for one (ServerOutage past the budget). None when
        the server cannot count or the failure is the count's own: the call goes as it is.
        """
        counts_left = 2 * len(self.servers)  # as for a call: a flapping server ends it
        while True:
            counts_left -= 1
            endpoint = self._here()
            started = endpoint.clock()
            try:
                return await endpoint.llm.size(messages, max_tokens=max_tokens, exact=exact)
            except LLMError as error:
                target = await self._elsewhere(endpoint, started, error, counts_left)
                if target is None:
                    log.warning("prompt could not be counted", error=str(error)[:200])
                    return None
                self._move(target)

    def close(self) -> None:
        """Release what the ticker still holds: its work is over (call once)."""
        self.server.gate.drop_hold(self.ticket)
        self.server.leave(self.ticket)
        self.servers.changed.set()

    async def chat(self, tag: CallTag, messages: list[dict[str, str]], **kwargs: Any) -> ChatResult:
        sized = {"messages": messages, "max_tokens": kwargs.get("max_tokens", 0)}
        ready = datetime.now(UTC)  # issued by the graph: a wait from here on is ours
        return await self._routed(tag, sized, lambda llm, rank, call, admit: llm.chat(
            tag, messages, priority=rank, admit=admit, ready_at=ready, call=call, **kwargs))

    async def send(self, tag: CallTag, body: dict[str, Any]) -> ChatResult:
        ready = datetime.now(UTC)
        return await self._routed(tag, body, lambda llm, rank, call, admit: llm.send(
            tag, body, priority=rank, admit=admit, ready_at=ready, call=call))

    async def _routed(self, tag: CallTag, sized: dict[str, Any], send: Send) -> ChatResult:
        call = Call()  # the same call on every endpoint it is sent to
        # A server that keeps flapping must not keep one call going round for ever.
        sends_left = 2 * len(self.servers)
        while True:
            sends_left -= 1
            endpoint = self._here()
            if endpoint.strategy.prefetch and not self.ticket.chained:
                # Outside the call: a wait for a chain slot is not an attempt at the server.
                await endpoint.enter_chain(self.ticket)
            started = endpoint.clock()  # the clock its readings' failures are timed on
            try:
                return await self._unless_gone(endpoint, self._on(endpoint, tag, sized, send, call))
            except LLMError as error:
                target = await self._elsewhere(endpoint, started, error, sends_left)
                if target is None:
                    raise
                log.warning("call sent again", node=tag.node, ticker=tag.ticker,
                            failed_at=endpoint.name, to=target.name, error=str(error)[:200])
                self.ticket.done -= 1  # the call is work left again
                self._move(target)

    async def _elsewhere(self, endpoint: Server, started: float, error: LLMError,
                         tries_left: int) -> Server | None:
        """Return where a call or count that failed at ``endpoint`` goes next; None: the
        failure is its own, or no try is left (ServerSet.after_failure decides the rest)."""
        if not server_fault(error) or tries_left <= 0:
            return None
        return await self.servers.after_failure(
            endpoint, started, reached=not isinstance(error, LLMConnectionError))

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
        self.server.leave(self.ticket)
        self.server.moved_out += 1
        target.arrive(self.ticket)
        target.moved_in += 1
        self.server = target
        self.servers.changed.set()

    async def _on(self, endpoint: Server, tag: CallTag, sized: dict[str, Any], send: Send,
                  call: Call) -> ChatResult:
        """Send one call through ``endpoint``'s gate."""
        ticket, gate = self.ticket, endpoint.gate
        if ticket.held_by is not None and ticket.held_by is not gate:
            ticket.held_by.release_hold(ticket)  # its context is in another replica's cache
        claim = await gate.claim(tag.node, sized)
        if not ticket.asked:
            ticket.asked = True
            self.servers.changed.set()  # the scheduler waits for this before the next start
        try:
            # A place per attempt, so a retry's backoff waits outside the gate.
            result = await send(endpoint.llm, priority(ticket), call,
                                functools.partial(self._attempt, endpoint, claim))
        finally:
            ticket.done += 1
        gate.learn(tag.node, sized, result)
        return result

    @asynccontextmanager
    async def _attempt(self, endpoint: Server, claim: Claim) -> AsyncIterator[None]:
        """Hold a place at ``endpoint``'s gate for one attempt; after a server fault, take a
        reading: a server found down holds its gate, so the next attempt waits there. A
        server that answered with ``Retry-After`` gets that pause from every call, before
        its place: back-pressure is the server's, not one call's."""
        await endpoint.quiet()
        try:
            async with endpoint.gate.slot(self.ticket, claim):
                yield
        except LLMError as error:
            asked = getattr(error, "retry_after_s", None)
            if isinstance(error, LLMHTTPError) and error.back_pressure and asked is not None:
                endpoint.asked_to_wait(asked)
            if server_fault(error):
                await endpoint.check()
            raise

    async def _unless_gone(self, endpoint: Server,
                           call: Coroutine[Any, Any, ChatResult]) -> ChatResult:
        """Await the call; if its endpoint goes down first and another is up, cancel it."""
        if not self.servers.several:
            return await call  # one endpoint: nowhere to go, so nothing to watch
        try:
            async with asyncio.TaskGroup() as group:
                watch = group.create_task(_gone(self.servers, endpoint))
                try:
                    return await call
                finally:
                    watch.cancel()
        except BaseExceptionGroup as group:
            raise first_error(group) from None


async def _gone(servers: ServerSet, endpoint: Server) -> None:
    """Raise EndpointGone once ``endpoint`` is down and another server is up to take over."""
    while endpoint.up or servers.alternative(endpoint) is None:
        await (endpoint.gone if endpoint.up else servers.health_event()).wait()
    raise EndpointGone(f"{endpoint.name} went down during the call")
