"""Test ticker validation, de-duplication and universe files."""

from __future__ import annotations

import pytest

from agents.errors import InputError
from agents.tickers import normalize_tickers, parse_ticker_list, read_universe


def test_normalize_uppercases_and_keeps_order() -> None:
    tickers, notes = normalize_tickers([" aapl", "msft ", "brk.b", "BF-B"])
    assert tickers == ["AAPL", "MSFT", "BRK.B", "BF-B"]
    assert notes == []


def test_duplicates_removed_with_a_note() -> None:
    tickers, notes = normalize_tickers(["AAPL", "msft", "aapl", "AAPL"])
    assert tickers == ["AAPL", "MSFT"]
    assert len(notes) == 1
    assert "AAPL" in notes[0] and "3" in notes[0]


# "." and ".." are folders of the snapshot (the date's own, the one above), not tickers.
@pytest.mark.parametrize("bad", ["AA PL", "$AAPL", "A" * 13, "AAPL!", "ÄPL", ".", "..", "-.-"])
def test_invalid_symbol_is_named(bad: str) -> None:
    with pytest.raises(InputError, match="invalid ticker symbol"):
        normalize_tickers(["MSFT", bad])


def test_no_tickers_is_an_error() -> None:
    with pytest.raises(InputError, match="no tickers"):
        normalize_tickers(["", "  "])


def test_parse_ticker_list_skips_blank_entries() -> None:
    assert parse_ticker_list("aapl, msft,,nvda,") == (["AAPL", "MSFT", "NVDA"], [])


def test_read_universe_with_comments(tmp_path) -> None:
    path = tmp_path / "u.txt"
    path.write_text("# nightly universe\n\naapl  # Apple\nMSFT\n  \nAAPL\n", encoding="utf-8")
    notes: list[str] = []
    assert read_universe(path, notes) == ["AAPL", "MSFT"]
    assert len(notes) == 1 and "AAPL" in notes[0]


def test_read_universe_names_bad_line(tmp_path) -> None:
    path = tmp_path / "u.txt"
    path.write_text("AAPL\nnot a ticker\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"u\.txt:2"):
        read_universe(path)


def test_empty_universe_is_an_error(tmp_path) -> None:
    path = tmp_path / "u.txt"
    path.write_text("# only comments\n\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"universe .*u\.txt is empty"):
        read_universe(path)


def test_missing_universe_is_an_error(tmp_path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        read_universe(tmp_path / "nope.txt")
