"""Every text file nightdesk reads from an operator may start with a UTF-8 byte-order mark.

A Windows editor (Notepad, Excel's "CSV UTF-8") writes one first; it is no part of the text:
the universe file, the settings file (NIGHTDESK_CONFIG), a server profile, and a snapshot's
JSON and CSV files each read the same with and without it.
"""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path

import pytest

from agents.data.demo import write_demo
from agents.tickers import read_universe
from app.config import load_settings
from serving.profiles import PROFILE_DIR, load_profile
from tests.unit.support.clirun import run_cli

BOM = "\ufeff"
AS_OF = date(2026, 11, 27)


def with_bom(path: Path) -> None:
    """Rewrite ``path`` with a byte-order mark before its text."""
    text = path.read_text(encoding="utf-8")
    assert not text.startswith(BOM)
    path.write_bytes(BOM.encode("utf-8") + text.encode("utf-8"))
    assert path.read_bytes()[:3] == b"\xef\xbb\xbf"


def test_a_universe_file_with_a_byte_order_mark_is_read_as_its_tickers(tmp_path: Path) -> None:
    path = tmp_path / "universe.txt"
    path.write_text("ALPH.DEMO\r\n# a comment\r\nbeta.demo\r\n", encoding="utf-8")
    with_bom(path)
    assert read_universe(path) == ["ALPH.DEMO", "BETA.DEMO"]


def test_a_settings_file_with_a_byte_order_mark_is_read(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    path = tmp_path / "nightdesk.toml"
    path.write_text('llm_model = "from-file"\ntemperature = 0.1\n', encoding="utf-8")
    with_bom(path)
    monkeypatch.setenv("NIGHTDESK_CONFIG", str(path))
    settings = load_settings()
    assert (settings.llm.model, settings.sampling.temperature) == ("from-file", 0.1)


def test_a_server_profile_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    shutil.copyfile(PROFILE_DIR / "cpu-tiny.toml", tmp_path / "cpu-tiny.toml")
    plain = load_profile("cpu-tiny", tmp_path)
    with_bom(tmp_path / "cpu-tiny.toml")
    assert load_profile("cpu-tiny", tmp_path) == plain


def test_a_snapshot_and_universe_with_byte_order_marks_freeze_through_the_cli(
        tmp_path: Path) -> None:
    """``data freeze --universe`` from a snapshot whose every file starts with a BOM."""
    source = tmp_path / "source"
    folder = write_demo(source, AS_OF, 2)
    lines = (folder / "universe.txt").read_text(encoding="utf-8").splitlines()
    tickers = [line for line in lines if line and not line.startswith("#")]
    assert len(tickers) == 2 and lines[0].startswith("#")  # the mark then comes before a comment
    (folder / "universe.txt").write_text("\n".join(tickers) + "\n", encoding="utf-8")
    marked = [p for p in folder.rglob("*") if p.suffix in (".json", ".csv", ".txt")]
    assert {p.suffix for p in marked} == {".json", ".csv", ".txt"}
    for path in marked:
        with_bom(path)
    result = run_cli("data", "freeze", "--provider", "snapshot", "--as-of", AS_OF.isoformat(),
                     "--universe", str(folder / "universe.txt"), "--source-dir", str(source),
                     "--out", str(tmp_path / "out"))
    assert result.code == 0, result.stderr
    assert "froze 2 of 2 tickers from snapshot" in result.stdout
    show = run_cli("data", "show", tickers[0], "--as-of", AS_OF.isoformat(),
                   "--provider", "snapshot", env={"NIGHTDESK_DATA_DIR": str(source)})
    assert show.code == 0, show.stderr
    assert tickers[0] in show.stdout
