"""Read the identifiers a URL carries: ticker symbols, batch ids and lists of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fastapi import HTTPException

from agents.tickers import check_symbol
from app.errors import InputError
from app.morning.batchids import parse_batch_id, parse_batch_ids

T = TypeVar("T")


def or_answer(status: int, parse: Callable[[], T]) -> T:
    """Return ``parse()``, or answer ``status`` with its InputError's message."""
    try:
        return parse()
    except InputError as error:
        raise HTTPException(status, str(error)) from None


def symbol_or_404(text: str) -> str:
    """Return the normalized symbol, or answer 404 for something that cannot be a ticker."""
    return or_answer(404, lambda: check_symbol(text))


def batch_ids(values: list[str]) -> list[int]:
    """Read ``ids=1,2`` or ``ids=1&ids=2`` into at least two batch ids, or answer 400."""
    return or_answer(400, lambda: parse_batch_ids(",".join(values), what="ids"))


def batch_id_or_404(text: str) -> int:
    """Return the batch id a path names, through the one parser (``app.morning.batchids``); answer
    404 for text that can name no batch (not ASCII digits, or beyond a 64-bit key)."""
    return or_answer(404, lambda: parse_batch_id(text, what="the batch in the path"))
