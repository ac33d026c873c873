"""Tell, before a night starts, whether its largest prompt can fit the server's context.

Every prompt is taken at its smallest (agents/smallest.py: all that agents/fitting.py may
leave out, left out). The analysts' prompts are rendered from the tickers' data and counted
whole; the later nodes' prompts are counted with earlier outputs as markers, and each
marker stands for as many tokens as that node's outputs came to at most in the previous
nightly batch of the same model (no more than its max_tokens now), or its max_tokens when
there is none. A prompt fails when that estimate plus the output tokens the server counts
(``PromptCounter.budget``) exceeds the server's max-model-len. Counting is the client's own
(app/promptsize.py): a prompt whose bytes alone prove it fits is not sent to /tokenize.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import httpx
import structlog
from sqlalchemy import Engine, func, select

from agents.smallest import SmallestPrompt
from app.config import Settings
from app.db.models import Batch, LLMCall
from app.errors import LLMError
from app.promptsize import PromptCounter, message_bytes
from serving.urls import redact, server_root

log = structlog.get_logger(__name__)

# /tokenize answers in milliseconds; a server slower than this is left to the night.
TOKENIZE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Misfit:
    """A prompt that cannot fit: its node, its ticker, the estimate and the server's limit."""

    node: str
    ticker: str
    tokens: int
    budget: int
    max_model_len: int
    carried: int  # of ``tokens``: the earlier outputs the prompt holds

    def describe(self) -> str:
        held = f", {self.carried} of them earlier nodes' outputs" if self.carried else ""
        plus = f" + max_tokens {self.budget}" if self.budget else ""
        return (f"{self.node}'s prompt at its smallest ({self.ticker}) is about {self.tokens} "
                f"tokens{held}{plus}: over the server's max_model_len {self.max_model_len}")


def output_bounds(engine: Engine, settings: Settings, budgets: dict[str, int]) -> dict[str, int]:
    """Return the tokens each node's output may take in a later prompt.

    ``budgets``: each node's max_tokens. The previous nightly batch of this model says how
    long its outputs were; a node it has no rows for is taken at its max_tokens.
    """
    with engine.connect() as conn:
        latest = conn.execute(
            select(func.max(LLMCall.batch_id)).join(Batch, Batch.id == LLMCall.batch_id)
            .where(Batch.kind == "nightly", LLMCall.status == "ok",
                   LLMCall.model == settings.llm_model)).scalar()
        seen: dict[str, int] = {}
        if latest is not None:
            seen = {node: int(tokens) for node, tokens in conn.execute(
                select(LLMCall.node, func.max(LLMCall.completion_tokens))
                .where(LLMCall.batch_id == latest, LLMCall.status == "ok",
                       LLMCall.completion_tokens.is_not(None))
                .group_by(LLMCall.node))}
    return {node: min(budget, seen.get(node, budget)) for node, budget in budgets.items()}


def http_client() -> httpx.AsyncClient:
    """Return the client that asks /tokenize (a unit test puts its fake server here)."""
    return httpx.AsyncClient(timeout=httpx.Timeout(TOKENIZE_TIMEOUT_S))


async def first_misfit(settings: Settings, base_url: str, prompts: Iterable[SmallestPrompt],
                       bounds: dict[str, int]) -> Misfit | None:
    """Return a prompt that cannot fit the server at ``base_url``, largest first; else None.

    None too when the server cannot tell: no /tokenize, or it does not answer (a server that
    is down is the outage watch's at night, or the endpoint check's before it).
    """
    def upper(prompt: SmallestPrompt) -> int:
        return message_bytes(prompt.messages) + sum(bounds[n] for n in prompt.carries)

    async with http_client() as http:
        counter = PromptCounter(settings, http, server_root(base_url) + "/tokenize")
        for prompt in sorted(prompts, key=upper, reverse=True):
            carried = sum(bounds[n] for n in prompt.carries)
            budget = counter.budget(prompt.max_tokens)
            if counter.fits_without_counting(prompt.messages, budget + carried):
                continue
            try:
                count = await counter.count(settings.llm_model, prompt.messages)
            except LLMError as error:
                log.info("context not checked before the night", endpoint=redact(base_url),
                         reason=str(error))
                return None
            if count is None or counter.max_model_len is None:
                return None
            if count + carried + budget > counter.max_model_len:
                return Misfit(prompt.node, prompt.ticker, count + carried, budget,
                              counter.max_model_len, carried)
    return None

