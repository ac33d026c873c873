"""Check the decision schema and the bounded, loud retry around it."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from agents.decision import SUMMARY_MAX_CHARS, Decision, decide, parse_decision, response_format
from app.errors import DecisionError, LLMHTTPError
from tests.unit.support.scripted_llm import MESSAGES, TAG, ScriptedLLM, prompt

VALID = {"rating": "Buy", "score": 0.7, "confidence": 0.8, "summary": "Strong growth."}


def test_schema_rejects_out_of_range_and_unknown() -> None:
    assert Decision.model_validate(VALID).rating == "Buy"
    for bad in ({"rating": "Strong Buy"}, {"score": 1.5}, {"confidence": -0.1},
                {"summary": ""}, {"summary": "x" * (SUMMARY_MAX_CHARS + 1)}, {"extra": 1}):
        with pytest.raises(ValidationError):
            Decision.model_validate({**VALID, **bad})
    with pytest.raises(ValueError, match="rating"):
        parse_decision(json.dumps({**VALID, "rating": "hold"}))
    with pytest.raises(ValueError, match="Invalid JSON"):
        parse_decision("Rating: Hold")


def test_a_raw_control_character_in_a_string_is_still_the_decision() -> None:
    # Guided decoding on vLLM 0.24 let a model put raw newlines and tabs inside the summary;
    # the reply means the same, and the stored summary is printable.
    content = json.dumps(VALID).replace(VALID["summary"], "Strong\nquarter,\tstrong guide.")
    assert "\n" in content  # a real newline, not an escaped one
    decision = parse_decision(content)
    assert (decision.rating, decision.summary) == ("Buy", "Strong quarter, strong guide.")
    # A reply cut off inside a string is still not one.
    with pytest.raises(ValueError, match=r"Invalid JSON: Unterminated string .* line 1"):
        parse_decision(content[:40])


def test_response_format_is_strict_json_schema() -> None:
    fmt = response_format()
    assert fmt["type"] == "json_schema"
    spec = fmt["json_schema"]
    assert spec["name"] == "decision" and spec["strict"] is True
    schema = spec["schema"]
    assert set(schema["required"]) == {"rating", "score", "confidence", "summary"}
    assert schema["additionalProperties"] is False
    assert schema["properties"]["rating"]["enum"] == [
        "Buy", "Overweight", "Hold", "Underweight", "Sell"]


def test_every_free_text_field_is_bounded_for_the_server() -> None:
    # Guided decoding can only close the JSON in time if every string has a maximum length;
    # an unbounded summary let the tiny model write until max_tokens and fail the ticker.
    properties = response_format()["json_schema"]["schema"]["properties"]
    free_text = [name for name, spec in properties.items()
                 if spec.get("type") == "string" and "enum" not in spec]
    assert free_text == ["summary"]
    assert all(properties[name]["maxLength"] == SUMMARY_MAX_CHARS for name in free_text)


async def test_valid_first_reply() -> None:
    llm = ScriptedLLM([json.dumps(VALID)])
    decision, _, attempts = await decide(llm, TAG, prompt, [], max_tokens=100, attempts=3)
    assert decision == Decision.model_validate(VALID) and attempts == 1
    assert llm.calls[0]["priority"] is None  # the gate's, from the ticker's ticket
    assert llm.calls[0]["response_format"] == response_format()


async def test_a_retried_decision_counts_the_http_attempts_of_every_call() -> None:
    llm = ScriptedLLM(["{}", "nope", json.dumps(VALID)], attempts_per_call=2)
    decision, _, attempts = await decide(llm, TAG, prompt, [], max_tokens=100, attempts=3)
    assert decision.rating == "Buy"
    assert len(llm.calls) == 3 and attempts == 6
    # The retry keeps the original messages as prefix, shows the bad reply, says what failed.
    retry = llm.calls[1]["messages"]
    assert retry[:2] == MESSAGES
    assert retry[2] == {"role": "assistant", "content": "{}"}
    assert "not a valid decision" in retry[3]["content"]


async def test_never_defaults_to_hold() -> None:
    llm = ScriptedLLM(["Hold", "Hold", "Hold"])
    with pytest.raises(DecisionError, match=r"ACME: .*2 call\(s\)"):
        await decide(llm, TAG, prompt, [], max_tokens=100, attempts=2)
    assert len(llm.calls) == 2


async def test_call_errors_propagate_unchanged() -> None:
    llm = ScriptedLLM([LLMHTTPError("HTTP 400", http_status=400)])
    with pytest.raises(LLMHTTPError):
        await decide(llm, TAG, prompt, [], max_tokens=100, attempts=3)
