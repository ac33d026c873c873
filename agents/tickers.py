"""Validate ticker symbols and read universe files (one ticker per line, '#' comments)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from agents.errors import InputError, os_said

# At least one letter or digit: "." and ".." name no ticker but a snapshot's folders (the
# as-of date's own, the data folder above it), which a ticker's files would be read from.
SYMBOL = re.compile(r"^(?=.*[A-Z0-9])[A-Z0-9.\-]{1,12}$")


def check_symbol(raw: str, where: str = "") -> str:
    """Return ``raw`` stripped and upper-cased, or raise InputError naming it."""
    symbol = raw.strip().upper()
    if not SYMBOL.fullmatch(symbol):
        place = f" ({where})" if where else ""
        raise InputError(
            f"invalid ticker symbol {raw.strip()!r}{place}: expected 1-12 of A-Z, 0-9, '.', "
            "'-', a letter or digit among them"
        )
    return symbol


def normalize_tickers(raw: Iterable[str]) -> tuple[list[str], list[str]]:
    """Upper-case and validate symbols, drop duplicates (first one wins) and say what was dropped.

    Blank entries are skipped (``"A,B,"`` split on commas gives one). Returns the tickers in
    input order and one note per symbol that appeared more than once. No tickers at all is an
    InputError: an empty universe must never look like a successful empty night.
    """
    symbols = [check_symbol(item) for item in raw if item.strip()]
    if not symbols:
        raise InputError("no tickers given")
    counts = Counter(symbols)
    notes = [
        f"removed duplicate ticker {symbol} ({count} occurrences, kept the first)"
        for symbol, count in counts.items()
        if count > 1
    ]
    return list(dict.fromkeys(symbols)), notes


def parse_ticker_list(text: str) -> tuple[list[str], list[str]]:
    """Split a comma- or space-separated command-line list and normalize it."""
    return normalize_tickers(re.split(r"[,\s]+", text))


def read_universe(path: Path | str, notes: list[str] | None = None) -> list[str]:
    """Read a universe file: one ticker per line; '#' starts a comment; blank lines are skipped.

    Duplicates are removed (first one wins); pass a list as ``notes`` to collect a note per
    removed duplicate. A missing file or a file with no tickers is an InputError.
    """
    path = Path(path)
    try:
        # utf-8-sig: an editor on Windows (Notepad, Excel's "CSV UTF-8") starts the file with
        # a byte-order mark, which is no part of the first ticker.
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"universe file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read universe file {path}: {os_said(error)}") from None
    symbols = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if entry:
            symbols.append(check_symbol(entry, where=f"{path}:{number}"))
    if not symbols:
        raise InputError(f"universe {path} is empty")
    tickers, dup_notes = normalize_tickers(symbols)
    if notes is not None:
        notes.extend(dup_notes)
    return tickers


def choose_tickers(tickers: str | None, universe: Path | str | None
                   ) -> tuple[list[str], list[str]]:
    """Return the tickers of exactly one of ``--tickers A,B`` or ``--universe FILE``, and notes."""
    if tickers is not None and universe is None:
        return parse_ticker_list(tickers)
    if universe is not None and tickers is None:
        notes: list[str] = []
        return read_universe(universe, notes), notes
    raise InputError("give exactly one of --tickers or --universe")
