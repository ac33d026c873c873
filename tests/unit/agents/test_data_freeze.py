"""Test freezing: demo -> freeze -> snapshot loads the same, and failures are per ticker."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from agents.data import get_provider
from agents.data.demo import DEMO_AS_OF, DemoProvider, write_demo
from agents.data.freeze import freeze
from agents.data.snapshot import SnapshotProvider
from agents.errors import ConfigError, DataError, InputError
from app.config import get_settings, load_settings

TICKERS = ["ALPH.DEMO", "BRAV.DEMO"]


def _same(a, b) -> None:
    pd.testing.assert_frame_equal(a.prices, b.prices)
    pd.testing.assert_frame_equal(a.indicators, b.indicators)
    assert a.fundamentals == b.fundamentals
    assert (a.news, a.social, a.demo, a.source) == (b.news, b.social, b.demo, b.source)


def test_round_trip_from_demo(tmp_path: Path) -> None:
    result = freeze(DemoProvider(), TICKERS, DEMO_AS_OF, tmp_path)
    assert result.frozen == TICKERS and result.failed == {}
    manifest = json.loads((tmp_path / "2026-11-27" / "manifest.json").read_text())
    assert manifest["demo"] is True and manifest["tickers"] == TICKERS
    snapshot = SnapshotProvider(tmp_path)
    for ticker in TICKERS:
        _same(DemoProvider().load(ticker, DEMO_AS_OF), snapshot.load(ticker, DEMO_AS_OF))
        pd.testing.assert_frame_equal(snapshot.forward_prices(ticker, DEMO_AS_OF, 60),
                                      DemoProvider().forward_prices(ticker, DEMO_AS_OF, 60),
                                      )


def test_refreeze_of_a_snapshot_is_byte_identical(tmp_path: Path) -> None:
    write_demo(tmp_path / "src", DEMO_AS_OF, 2)
    stamp = "2026-11-27T00:00:00+00:00"
    freeze(SnapshotProvider(tmp_path / "src"), TICKERS, DEMO_AS_OF, tmp_path / "dst",
           created_at=stamp)
    for name in ("manifest.json", "universe.txt", "ALPH.DEMO/prices.csv",
                 "BRAV.DEMO/news.json", "BRAV.DEMO/fundamentals.json"):
        src = tmp_path / "src" / "2026-11-27" / name
        dst = tmp_path / "dst" / "2026-11-27" / name
        assert src.read_bytes() == dst.read_bytes(), name


def test_failing_ticker_is_reported_and_others_frozen(tmp_path: Path) -> None:
    result = freeze(DemoProvider(), ["ALPH.DEMO", "AAPL"], DEMO_AS_OF, tmp_path)
    assert result.frozen == ["ALPH.DEMO"]
    assert "AAPL" in result.failed and "\n" not in result.failed["AAPL"]
    assert (tmp_path / "2026-11-27" / "ALPH.DEMO" / "prices.csv").is_file()
    assert not (tmp_path / "2026-11-27" / "AAPL").exists()


def test_freeze_into_its_own_source_refused(tmp_path: Path) -> None:
    write_demo(tmp_path, DEMO_AS_OF, 1)
    with pytest.raises(InputError, match="overwrite its own source"):
        freeze(SnapshotProvider(tmp_path), ["ALPH.DEMO"], DEMO_AS_OF, tmp_path)


def test_get_provider_by_name_and_settings(tmp_path: Path) -> None:
    assert get_provider("demo").name == "demo"
    snapshot = get_provider("snapshot", tmp_path)
    assert isinstance(snapshot, SnapshotProvider) and snapshot.data_dir == tmp_path
    from_settings = get_provider(load_settings(data_dir=tmp_path).pipeline())
    assert isinstance(from_settings, SnapshotProvider) and from_settings.data_dir == tmp_path
    with pytest.raises(ConfigError, match="unknown data provider 'bogus'"):
        get_provider("bogus")
    with pytest.raises(ConfigError, match="needs a data folder"):
        get_provider("snapshot")  # no folder guessed relative to wherever this runs


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from app.cli.data import app

    monkeypatch.setenv("NIGHTDESK_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    yield lambda *args: CliRunner().invoke(app, list(args))
    get_settings.cache_clear()


def test_cli_freeze_partial_failure(cli, tmp_path: Path) -> None:
    result = cli("freeze", "--provider", "demo", "--tickers", "alph.demo,AAPL,ALPH.DEMO",
                 "--as-of", "2026-11-27", "--out", str(tmp_path / "frozen"))
    assert result.exit_code == 0, result.output
    assert "froze 1 of 2" in result.output
    assert "failed:" in result.output and "AAPL" in result.output
    assert "duplicate" in result.output
    bundle = SnapshotProvider(tmp_path / "frozen").load("ALPH.DEMO", date(2026, 11, 27))
    assert bundle.demo


def test_cli_freeze_all_fail_exits_non_zero(cli, tmp_path: Path) -> None:
    result = cli("freeze", "--provider", "demo", "--tickers", "AAPL,MSFT",
                 "--as-of", "2026-11-27", "--out", str(tmp_path / "frozen"))
    assert result.exit_code != 0
    assert not (tmp_path / "frozen" / "2026-11-27" / "manifest.json").exists()


def test_cli_freeze_from_snapshot_with_universe(cli, tmp_path: Path) -> None:
    folder = write_demo(tmp_path / "data", DEMO_AS_OF, 3)
    result = cli("freeze", "--provider", "snapshot", "--universe", str(folder / "universe.txt"),
                 "--as-of", "2026-11-27", "--out", str(tmp_path / "copy"))
    assert result.exit_code == 0, result.output
    assert SnapshotProvider(tmp_path / "copy").tickers(DEMO_AS_OF) == [
        "ALPH.DEMO", "BRAV.DEMO", "COBL.DEMO"]


def test_a_ticker_an_earlier_freeze_left_is_not_read(cli, tmp_path: Path) -> None:
    # A DEMO freeze of three tickers, then one of market data over it in which COBL.DEMO
    # failed: its DEMO folder stayed, and a night naming it analyzed that synthetic data
    # under the new manifest's label (not DEMO, source "user") while the freeze had said
    # "failed". The snapshot is what its manifest lists.
    out = tmp_path / "frozen"
    tickers = ["ALPH.DEMO", "BRAV.DEMO", "COBL.DEMO"]
    assert freeze(DemoProvider(), tickers, DEMO_AS_OF, out).frozen == tickers
    source = write_demo(tmp_path / "src", DEMO_AS_OF, 3)
    manifest = json.loads((source / "manifest.json").read_text())
    (source / "manifest.json").write_text(json.dumps({**manifest, "provider": "user",
                                                      "demo": False}))
    (source / "COBL.DEMO" / "prices.csv").write_text("oops\n")
    result = cli("freeze", "--provider", "snapshot", "--source-dir", str(tmp_path / "src"),
                 "--tickers", ",".join(tickers), "--as-of", "2026-11-27", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert ("note: 1 ticker folder(s) of an earlier freeze of 2026-11-27 are not in this "
            "snapshot and are not read: COBL.DEMO") in result.output
    snapshot = SnapshotProvider(out)
    assert (out / "2026-11-27" / "COBL.DEMO" / "prices.csv").is_file()  # kept, not deleted
    assert snapshot.missing(tickers, DEMO_AS_OF) == ["COBL.DEMO"]  # the night is refused
    with pytest.raises(DataError, match=r"^COBL\.DEMO: not in snapshot .*: its manifest.json "
                                        "does not list it"):
        snapshot.load("COBL.DEMO", DEMO_AS_OF)
    assert not snapshot.load("ALPH.DEMO", DEMO_AS_OF).demo  # this freeze's own, as labelled
