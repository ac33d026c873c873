"""Fit a node's prompt into the server's context by leaving out its lowest-value parts first.

A prompt plus its output budget over the server's max-model-len is refused by the server.
Rather than fail the ticker, a node leaves out context in this order until the prompt fits:

1. debate turns, oldest first (the investment debate's or the risk discussion's);
2. news items, oldest first;
3. social posts, oldest first;
4. in a decision's re-ask, the rejected reply (the correction that follows it stays).

Every call goes through ``fit``, a re-ask too: the rejected reply and the correction it
appends to a prompt already fitted to the limit would otherwise overflow it.

The analyst reports, prices, indicators, fundamentals and the node's own instructions are
never left out: a prompt that does not fit without its droppable parts goes out as small
as it can be and the client's own length check fails it (``context_length``), which fails
only its ticker. A node hands its client the whole ``Prompt``; the client fits it (``fit``,
counting with its server: a ``Measure``) as the first step of the call, so this module only
decides what to leave out, and knows prompts, not servers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

DEBATE_TURN = "debate turn"
NEWS_ITEM = "news item"
SOCIAL_POST = "social post"
REJECTED_REPLY = "rejected reply"
DROP_ORDER: tuple[str, ...] = (DEBATE_TURN, NEWS_ITEM, SOCIAL_POST, REJECTED_REPLY)

Messages = list[dict[str, str]]
# Render the node's messages with the first ``k`` droppable units (in drop order) left out.
Render = Callable[[int], Messages]


@dataclass(frozen=True)
class PromptSize:
    """How a prompt compares with what the server takes."""

    tokens: int | None
    """The prompt's tokens as the server counts them; None when a cheap bound proved it fits."""
    limit: int
    """Prompt tokens the server takes with this output budget."""

    @property
    def fits(self) -> bool:
        return self.tokens is None or self.tokens <= self.limit


class Measure(Protocol):
    """Count a prompt against the server's limit (``app.llm.TrackedLLM.measure`` is one)."""

    async def __call__(self, messages: Messages, *, max_tokens: int,
                       exact: bool = False) -> PromptSize | None:
        """Return the prompt's size, or None when the server cannot count; raise LLMError as
        the call would where its servers keep failing the count (app.traffic.client).

        With ``exact`` the tokens are counted even when a cheap bound shows the prompt fits.
        """
        ...


@dataclass(frozen=True)
class Prompt:
    """A node's prompt as it asks its client for it: ``render(k)`` renders it with the first
    ``k`` of its droppable ``units`` (in drop order) left out; the client fits it (``fit``)."""

    render: Render
    units: Sequence[str] = ()


def fixed(messages: Messages) -> Prompt:
    """Return a prompt of ``messages`` with nothing to leave out."""
    return Prompt(lambda _: messages)


@dataclass(frozen=True)
class Trim:
    """What the guard left out of one call's prompt, recorded on its ``llm_calls`` row."""

    dropped: tuple[tuple[str, int], ...]  # (unit kind, how many), in drop order
    tokens: int | None  # prompt tokens saved; None when the server could not count them

    def describe(self) -> str:
        """Return e.g. ``"2 debate turns, 3 news items"``."""
        return ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in self.dropped)


def droppable(turns: int = 0, news: int = 0, social: int = 0) -> list[str]:
    """Return a node's droppable units in drop order, one entry per unit."""
    return [DEBATE_TURN] * turns + [NEWS_ITEM] * news + [SOCIAL_POST] * social


def left_out(units: Sequence[str], k: int, kind: str) -> int:
    """Return how many units of ``kind`` leaving out the first ``k`` units removes."""
    return sum(1 for unit in units[:k] if unit == kind)


async def fit(measure: Measure, render: Render, units: Sequence[str], *,
              max_tokens: int) -> tuple[Messages, Trim | None]:
    """Return the messages with the fewest units left out that fit, and what was left out.

    When even leaving out every unit does not fit, return that smallest prompt (the
    client's length check then fails the call as ``context_length``).
    """
    full = render(0)
    size = await measure(full, max_tokens=max_tokens)
    if size is None or size.fits or not units:
        return full, None
    # Leaving out more never makes a prompt longer, so bisect for the fewest that fit.
    sizes: dict[int, PromptSize | None] = {}
    lo, hi, best = 1, len(units), None
    while lo <= hi:
        mid = (lo + hi) // 2
        sizes[mid] = await measure(render(mid), max_tokens=max_tokens, exact=True)
        current = sizes[mid]
        if current is None or current.fits:
            best, hi = mid, mid - 1
        else:
            lo = mid + 1
    k = best if best is not None else len(units)
    if k not in sizes:
        sizes[k] = await measure(render(k), max_tokens=max_tokens, exact=True)
    final = sizes[k]
    saved = (None if final is None or final.tokens is None or size.tokens is None
             else size.tokens - final.tokens)
    counts = Counter(units[:k])
    trim = Trim(tuple((kind, counts[kind]) for kind in DROP_ORDER if counts[kind]), saved)
    return render(k), trim
