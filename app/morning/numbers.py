"""Show a figure as text, the same on a page (the ``fmt`` filter) and in a CLI table, and a
count with its noun, singular for one (the ``counted`` filter)."""

from __future__ import annotations

from typing import Any


def number(value: Any, spec: str = ".1f", missing: str = "—") -> str:
    """Return ``value`` formatted by ``spec`` when it is a number (int or float), ``missing``
    for None, and anything else (a label, a strategy name) as it is."""
    if value is None:
        return missing
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return format(value, spec)


def counted(count: int, noun: str, nouns: str | None = None) -> str:
    """Return ``count`` with ``noun`` for one and ``nouns`` (default ``noun`` + "s") for
    any other count: ``1 ticker``, ``3 tickers``, ``0 calls``."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"
