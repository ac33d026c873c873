"""Describe the fake server's chat exchange: the request it saw and the reply it gives.

Part of the fake vLLM server (``tests.fakevllm``, which re-exports these names).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_DECISION = {
    "rating": "Overweight",
    "score": 0.4,
    "confidence": 0.6,
    "summary": "Fake decision: steady trend and sound fundamentals outweigh the risks.",
}
# What vLLM answers (HTTP 400) to a prompt plus max_tokens over max-model-len.
CONTEXT_LENGTH_MESSAGE = (
    "This model's maximum context length is 2048 tokens. However, you requested 2600 "
    "tokens (2100 in the messages, 500 in the completion). Please reduce the length of "
    "the messages or completion."
)


def count_tokens(text: str) -> int:
    """Count 'tokens' the fake way: one per 4 bytes, at least 1; deterministic and cheap."""
    return max(1, len(text.encode()) // 4)


def prompt_token_count(messages: list[dict[str, Any]]) -> int:
    """Count a chat prompt's tokens: content plus a fixed per-message template overhead.

    Never more than the prompt's bytes, as ``TrackedLLM``'s short-prompt shortcut assumes.
    """
    return sum(count_tokens(str(m.get("content") or "")) + 4 for m in messages)


@dataclass
class Reply:
    """What the fake answers to one request; the defaults are a prompt, clean answer."""

    content: str = ""
    status: int = 200  # anything but 200 answers with an OpenAI-style error body instead
    error: str = "fake server error"
    headers: dict[str, str] = field(default_factory=dict)  # sent with an error status
    prompt_tokens: int | None = None  # None: counted from the request
    completion_tokens: int | None = None  # None: counted from ``content``
    cached_tokens: int | None = 0  # None: leave ``prompt_tokens_details`` out
    finish_reason: str = "stop"
    delay_s: float = 0.0  # once admitted, before decoding starts (an error waits too)
    token_delay_s: float = 0.0  # per completion token: decoding takes tokens x this
    chunks: int = 3  # content split into this many SSE deltas
    hold: asyncio.Event | None = None  # once admitted, wait for this before decoding
    drop: bool = False  # close the connection without an answer
    cut_after: int | None = None  # break the stream after this many content chunks, unfinished
    # How it breaks: "drop" the connection (the server died), "reset" it (a peer's reset, as
    # httpx words the socket's: "[Errno 104] Connection reset by peer"), "end" it cleanly with no
    # finish reason and no usage (a truncated answer that looks whole to a careless client),
    # or send one malformed chunk and stop: "garbage" (a data line that is not JSON) or
    # "misshapen" (JSON that is not a chunk).
    cut: str = "drop"
    # A proxy in front answering HTTP 200 with this body instead (an HTML page, a JSON with
    # no choices, JSON cut short), sent as ``page_type``; no request reaches the server.
    page: str | None = None
    page_type: str = "text/html"


@dataclass
class ChatRequest:
    """One chat completion request as the fake saw it, and how it was answered."""

    index: int  # 0-based order of arrival among chat requests
    body: dict[str, Any]
    ticker: str | None  # from the seed, when it matches a known (ticker, node, sample)
    node: str | None
    sample: int | None
    key: str = ""  # the last message's content: what identifies a call across its retries
    attempt: int = 1  # how many chat requests with this key have arrived, this one included
    at: float = field(default_factory=time.monotonic)  # arrival, on the load's clock
    served: Reply | None = None  # filled once the reply is chosen
    completed: bool = False  # the whole answer, usage included, went out

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def system(self) -> str:
        return next((m["content"] for m in self.messages if m["role"] == "system"), "")

    @property
    def user(self) -> str:
        """Return the first user message (the node's prompt)."""
        return next((m["content"] for m in self.messages if m["role"] == "user"), "")

    @property
    def structured(self) -> bool:
        return self.body.get("response_format") is not None

    @property
    def max_tokens(self) -> int | None:
        return self.body.get("max_tokens")


@dataclass
class Recorded:
    """Any HTTP request that reached the fake."""

    method: str
    path: str
    body: Any
    headers: dict[str, str]


# Returns Reply | str | None, or an awaitable of one.
Script = Callable[[ChatRequest], Any]


def split(text: str, parts: int) -> list[str]:
    """Split text into up to ``parts`` non-empty pieces that join back to it."""
    if not text:
        return []
    size = max(1, -(-len(text) // max(1, parts)))
    return [text[i:i + size] for i in range(0, len(text), size)]


def spread(total: int, parts: int) -> list[int]:
    """Split ``total`` tokens over ``parts`` pieces as evenly as whole tokens allow."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def default_reply(chat: ChatRequest) -> Reply | str:
    """Return a decision JSON, ``max_tokens`` tokens for ``ignore_eos``, or a short report."""
    if chat.structured:
        return json.dumps(DEFAULT_DECISION)
    if chat.body.get("ignore_eos") and chat.max_tokens:
        # vLLM generates exactly max_tokens when told to ignore the end of sequence.
        return Reply(" tok" * chat.max_tokens, completion_tokens=chat.max_tokens,
                     finish_reason="length")
    who = f"{chat.node or 'node'} on {chat.ticker or 'ticker'}"
    return f"[{who}] Fake analysis #{chat.index}: the evidence is mixed."
