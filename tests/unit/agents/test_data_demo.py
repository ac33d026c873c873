"""Test the seeded demo market: byte-stable snapshots, labels, and the `data demo` command."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from agents.data.demo import DEMO_AS_OF, DemoProvider, demo_tickers, write_demo
from agents.data.snapshot import SnapshotProvider
from agents.errors import DataError, InputError
from agents.tickers import read_universe
from app.config import get_settings


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_two_writes_are_byte_identical(tmp_path: Path) -> None:
    write_demo(tmp_path / "a")
    write_demo(tmp_path / "b")
    first, second = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert first == second
    assert len(first) == 2 + 20 * 4  # manifest, universe, four files per ticker


def test_layout_manifest_and_universe(tmp_path: Path) -> None:
    folder = write_demo(tmp_path, DEMO_AS_OF, 20)
    assert folder == tmp_path / "2026-11-27"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["demo"] is True and manifest["provider"] == "demo"
    assert manifest["tickers"] == demo_tickers(20)
    universe = folder / "universe.txt"
    assert universe.read_text().startswith("#")
    assert read_universe(universe) == manifest["tickers"]
    prices = pd.read_csv(folder / "ALPH.DEMO" / "prices.csv", parse_dates=["date"])
    assert (prices["date"] > pd.Timestamp(DEMO_AS_OF)).sum() == 60
    assert len(prices) == 300
    assert (prices["high"] >= prices[["open", "close"]].max(axis=1)).all()
    assert (prices["low"] <= prices[["open", "close"]].min(axis=1)).all()


def test_other_as_of_shifts_dates(tmp_path: Path) -> None:
    day = date(2025, 6, 13)
    folder = write_demo(tmp_path, day, 3)
    assert folder.name == "2025-06-13"
    assert SnapshotProvider(tmp_path).load("BRAV.DEMO", day).prices.index[-1] == pd.Timestamp(day)


def test_provider_matches_its_snapshot(tmp_path: Path) -> None:
    write_demo(tmp_path, DEMO_AS_OF, 3)
    for ticker in demo_tickers(3):
        live = DemoProvider().load(ticker, DEMO_AS_OF)
        stored = SnapshotProvider(tmp_path).load(ticker, DEMO_AS_OF)
        pd.testing.assert_frame_equal(live.prices, stored.prices, check_exact=True,
                                      )
        assert live.fundamentals == stored.fundamentals
        assert live.news == stored.news and live.social == stored.social
        assert live.demo and stored.demo


def test_forward_days_beyond_default_keep_history() -> None:
    provider = DemoProvider()
    long = provider.forward_prices("ALPH.DEMO", DEMO_AS_OF, 90)
    short = provider.forward_prices("ALPH.DEMO", DEMO_AS_OF, 60)
    assert len(long) == 90
    pd.testing.assert_frame_equal(long.head(60), short)


def test_tickers_differ_and_count_is_checked() -> None:
    provider = DemoProvider()
    a = provider.load("ALPH.DEMO", DEMO_AS_OF).prices["close"]
    b = provider.load("BRAV.DEMO", DEMO_AS_OF).prices["close"]
    assert not a.equals(b)
    with pytest.raises(InputError):
        demo_tickers(0)
    with pytest.raises(InputError):
        demo_tickers(1000)
    with pytest.raises(DataError, match="AAPL: not a demo ticker"):
        provider.load("AAPL", DEMO_AS_OF)


def test_cli_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli.data import app

    monkeypatch.setenv("NIGHTDESK_DATA_DIR", str(tmp_path / "default"))
    get_settings.cache_clear()
    result = CliRunner().invoke(app, ["demo", "--as-of", "2026-01-30", "--tickers", "4",
                                      "--out", str(tmp_path / "out")])
    get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert "DEMO" in result.output
    assert read_universe(tmp_path / "out" / "2026-01-30" / "universe.txt") == demo_tickers(4)
    assert not (tmp_path / "default").exists()
