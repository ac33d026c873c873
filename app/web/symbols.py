"""Read the identifiers a URL carries: ticker symbols and lists of batch ids."""

from __future__ import annotations

from fastapi import HTTPException

from agents.tickers import check_symbol
from app.errors import InputError


def symbol_or_404(text: str) -> str:
    """Return the normalized symbol, or answer 404 for something that cannot be a ticker."""
    try:
        return check_symbol(text)
    except InputError as error:
        raise HTTPException(404, str(error)) from None


def batch_ids(values: list[str]) -> list[int]:
    """Read ``ids=1,2`` or ``ids=1&ids=2`` into at least two batch ids, or answer 400."""
    try:
        ids = [int(part) for value in values for part in value.split(",") if part.strip()]
    except ValueError:
        raise HTTPException(400, "ids are batch numbers, e.g. ids=3,4") from None
    if len(ids) < 2:
        raise HTTPException(400, "compare needs at least two batch ids")
    return ids
