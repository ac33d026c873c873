"""Define the final decision and obtain it from the server as validated structured output."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agents.chat import CallTag, ChatClient, ChatResult
from agents.errors import DecisionError
from agents.fitting import REJECTED_REPLY, Messages, Prompt, Render
from agents.prompting import render

log = structlog.get_logger(__name__)

Rating = Literal["Buy", "Overweight", "Hold", "Underweight", "Sell"]
RATINGS: tuple[str, ...] = ("Buy", "Overweight", "Hold", "Underweight", "Sell")

# The score range each rating stands for, closed at both ends: a score on a boundary agrees
# with both neighbours. The prompt states these bands; a decision whose score lies outside its
# rating's band contradicts itself, is asked again, and is flagged if it still does.
SCORE_BANDS: dict[str, tuple[float, float]] = {
    "Buy": (0.5, 1.0),
    "Overweight": (0.15, 0.5),
    "Hold": (-0.15, 0.15),
    "Underweight": (-0.5, -0.15),
    "Sell": (-1.0, -0.5),
}


def rating_for_score(score: float) -> str:
    """Return the rating whose band holds ``score``; a boundary goes away from Hold."""
    if score >= SCORE_BANDS["Buy"][0]:
        return "Buy"
    if score >= SCORE_BANDS["Overweight"][0]:
        return "Overweight"
    if score > SCORE_BANDS["Underweight"][1]:
        return "Hold"
    if score > SCORE_BANDS["Sell"][1]:
        return "Underweight"
    return "Sell"


def contradicts(rating: str, score: float) -> bool:
    """Return True when ``score`` lies outside the band of ``rating``."""
    low, high = SCORE_BANDS[rating]
    return not low <= score <= high


def bands_text() -> str:
    """Describe the bands in one line, as the prompt and the schema state them."""
    return "; ".join(f"{r} {lo:+.2f} to {hi:+.2f}" for r, (lo, hi) in SCORE_BANDS.items())


SUMMARY_MAX_CHARS = 500
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


class Decision(BaseModel):
    """The portfolio manager's verdict on one ticker."""

    # additionalProperties=false, which strict JSON-schema mode requires.
    model_config = ConfigDict(extra="forbid")

    rating: Rating = Field(description="Five-tier rating, from most to least favourable.")
    score: float = Field(ge=-1.0, le=1.0,
                         description="-1 strongly bearish ... 0 neutral ... +1 strongly bullish; "
                                     "within the rating's band: " + bands_text() + ".")
    confidence: float = Field(ge=0.0, le=1.0, description="How sure the desk is, 0 to 1.")
    # Bounded so the server's guided decoding must close the string: a small model otherwise
    # writes until max_tokens and the cut-off JSON fails the ticker. 500 characters hold three
    # sentences; on the tiny CPU model the whole reply then stays under 170 tokens.
    summary: str = Field(min_length=1, max_length=SUMMARY_MAX_CHARS,
                         description="Two or three sentences explaining the rating.")

    @field_validator("summary")
    @classmethod
    def _printable(cls, summary: str) -> str:
        # A raw control character that came through the parse (see parse_decision) would
        # break the ranking's table and the web page: a space says the same. NUL is dropped,
        # as the store drops it everywhere (app/db/text.py).
        return CONTROL_CHARS.sub(" ", summary.replace("\x00", ""))


def response_format() -> dict[str, Any]:
    """Return the ``response_format`` that makes the server enforce the Decision schema."""
    return {
        "type": "json_schema",
        "json_schema": {"name": "decision", "schema": Decision.model_json_schema(), "strict": True},
    }


def parse_decision(content: str) -> Decision:
    """Validate a structured reply; raise ValueError saying what is wrong with it."""
    try:
        # strict=False lets a raw control character (a newline, a tab) stand inside a string.
        # vLLM 0.24's guided decoding lets a model write them, and a strict parser would fail
        # the whole decision over one.
        data = json.loads(content, strict=False)
    except json.JSONDecodeError as error:
        raise ValueError(f"reply: Invalid JSON: {error.msg} at line {error.lineno} column "
                         f"{error.colno}") from None
    try:
        return Decision.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reply"
        raise ValueError(f"{where}: {first['msg']} ({error.error_count()} error(s))") from None


async def decide(
    llm: ChatClient,
    tag: CallTag,
    prompt: Render,
    units: Sequence[str],
    *,
    max_tokens: int,
    attempts: int,
) -> tuple[Decision, ChatResult, int]:
    """Ask for the decision up to ``attempts`` times; return it, the last reply and HTTP attempts.

    ``prompt`` and ``units`` are the node's prompt and its droppable parts (agents.fitting):
    every call, the first and each re-ask (the prompt, the rejected reply, a correction), is
    asked for as a ``Prompt``, which the client fits into the server's context before it
    sends it. Raise DecisionError when no reply validates: a missing decision fails the
    ticker, it never becomes a Hold. A valid decision whose score contradicts its rating is
    asked again while attempts remain; if no later reply does better it is returned as it
    is, and the store flags it.
    """
    used = 0  # HTTP attempts of every call so far
    asked = prompt
    ask_units: Sequence[str] = units
    problem = "no reply"
    fallback: tuple[Decision, ChatResult] | None = None
    for call in range(1, attempts + 1):
        result = await llm.chat(tag, Prompt(asked, ask_units), max_tokens=max_tokens,
                                response_format=response_format())
        used += result.attempts
        try:
            decision = parse_decision(result.content)
        except ValueError as error:
            problem = str(error)
            if result.finish_reason == "length":
                problem += f"; reply cut off at max_tokens={max_tokens}"
        else:
            if not contradicts(decision.rating, decision.score):
                return decision, result, used
            fallback = decision, result
            low, high = SCORE_BANDS[decision.rating]
            problem = (f"the rating {decision.rating} needs a score from {low:+.2f} to "
                       f"{high:+.2f}, but the score is {decision.score:+.2f}; make the rating "
                       f"and the score agree ({bands_text()})")
        log.warning("decision failed validation", call=call, of=attempts, problem=problem)
        # Feeding the bad reply back changes the prompt, so a seeded server does not repeat it;
        # while the re-ask needs no more left out, the prompt stays a prefix for the cache.
        asked = reask(prompt, len(units), result.content[:4000], problem)
        ask_units = [*units, REJECTED_REPLY]
    if fallback is not None:
        return fallback[0], fallback[1], used
    raise DecisionError(
        f"{tag.ticker}: portfolio manager gave no valid decision in {attempts} call(s) "
        f"(sample {tag.sample}); last problem: {problem}"
    )


def reask(prompt: Render, droppable: int, reply: str, problem: str) -> Render:
    """Render a re-ask: the prompt, the rejected reply and the correction, to fit as one.

    Its droppable units are the prompt's, then the rejected reply: left out only when the
    prompt without any of its own still does not fit (the correction says what was wrong).
    """
    correction = {"role": "user", "content": render("decision_retry.j2", problem=problem)}

    def messages(k: int) -> Messages:
        shown = [] if k > droppable else [{"role": "assistant", "content": reply}]
        return [*prompt(min(k, droppable)), *shown, correction]

    return messages
