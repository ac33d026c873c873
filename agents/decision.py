"""Define the final decision and obtain it from the server as validated structured output."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.prompting import render
from app.errors import DecisionError

if TYPE_CHECKING:
    from agents.fitting import Trim
    from agents.state import ChatClient
    from app.llm import CallTag, ChatResult

log = structlog.get_logger(__name__)

Rating = Literal["Buy", "Overweight", "Hold", "Underweight", "Sell"]
RATINGS: tuple[str, ...] = ("Buy", "Overweight", "Hold", "Underweight", "Sell")


class Decision(BaseModel):
    """The portfolio manager's verdict on one ticker."""

    # additionalProperties=false, which strict JSON-schema mode requires.
    model_config = ConfigDict(extra="forbid")

    rating: Rating = Field(description="Five-tier rating, from most to least favourable.")
    score: float = Field(ge=-1.0, le=1.0,
                         description="-1 strongly bearish ... 0 neutral ... +1 strongly bullish.")
    confidence: float = Field(ge=0.0, le=1.0, description="How sure the desk is, 0 to 1.")
    summary: str = Field(min_length=1, description="Two or three sentences explaining the rating.")


def response_format() -> dict[str, Any]:
    """Return the ``response_format`` that makes the server enforce the Decision schema."""
    return {
        "type": "json_schema",
        "json_schema": {"name": "decision", "schema": Decision.model_json_schema(), "strict": True},
    }


def parse_decision(content: str) -> Decision:
    """Validate a structured reply; raise ValueError saying what is wrong with it."""
    try:
        return Decision.model_validate_json(content)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reply"
        raise ValueError(f"{where}: {first['msg']} ({error.error_count()} error(s))") from None


async def decide(
    llm: ChatClient,
    tag: CallTag,
    messages: list[dict[str, str]],
    *,
    max_tokens: int,
    attempts: int,
    priority: int | None = None,
    trimmed: Trim | None = None,
) -> tuple[Decision, ChatResult, int]:
    """Ask for the decision up to ``attempts`` times; return it, the last reply and HTTP attempts.

    Raise DecisionError when no reply validates: a missing decision fails the ticker,
    it never becomes a Hold.
    """
    first_attempt = 1
    conversation = messages
    problem = "no reply"
    for call in range(1, attempts + 1):
        result = await llm.chat(tag, conversation, max_tokens=max_tokens,
                                response_format=response_format(), priority=priority,
                                first_attempt=first_attempt, trimmed=trimmed)
        # Rows are unique per attempt number, so the next call numbers after this one's tries.
        first_attempt += result.attempts
        try:
            return parse_decision(result.content), result, first_attempt - 1
        except ValueError as error:
            problem = str(error)
            if result.finish_reason == "length":
                problem += f"; reply cut off at max_tokens={max_tokens}"
        log.warning("decision failed validation", call=call, of=attempts, problem=problem)
        # Feeding the bad reply back changes the prompt, so a seeded server does not repeat it;
        # the original messages stay a prefix, so the prefix cache still applies.
        conversation = [
            *messages,
            {"role": "assistant", "content": result.content[:4000]},
            {"role": "user", "content": render("decision_retry.j2", problem=problem)},
        ]
    raise DecisionError(
        f"{tag.ticker}: portfolio manager gave no valid decision in {attempts} call(s) "
        f"(sample {tag.sample}); last problem: {problem}"
    )
