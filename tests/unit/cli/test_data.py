"""`nightdesk data show` of a ticker or a date the snapshots lack is bad input (exit 2), as
`run` refuses the same input; it exited 1, a failed batch's code."""

from __future__ import annotations

from pathlib import Path

from tests.unit.support.clirun import run_cli


def test_data_show_of_a_ticker_or_date_without_data_is_bad_input(demo_dir: Path) -> None:
    env = {"NIGHTDESK_DATA_DIR": str(demo_dir)}
    for argv in (("NOPE.DEMO",), ("ALPH.DEMO", "--as-of", "2020-01-02")):
        done = run_cli("data", "show", *argv, env=env)
        assert done.code == 2, done.stderr  # as `run` refuses it; 1 is a failed batch's
        assert done.error_lines[0].startswith("error: ") and len(done.error_lines) == 1




def test_data_freeze_from_a_source_folder_that_is_not_there_is_bad_input(
        tmp_path: Path) -> None:
    done = run_cli("data", "freeze", "--provider", "snapshot", "--as-of", "2026-11-27",
                   "--tickers", "ALPH.DEMO", "--source-dir", str(tmp_path / "nonexistent"),
                   "--out", str(tmp_path / "out"))
    assert done.code == 2, done.stderr  # it exited 1, a failed run's, after every ticker failed
    assert done.error_lines == [f"error: --source-dir {tmp_path / 'nonexistent'}: no such folder"]


def test_data_show_without_a_date_reads_the_snapshot_a_night_would(tmp_path: Path) -> None:
    # `run` takes the newest snapshot; `data show` took the demo's own date, so after a
    # `data freeze` of another date it said "no snapshot for 2026-11-27".
    data = tmp_path / "data"
    env = {"NIGHTDESK_DATA_DIR": str(data)}
    for day in ("2025-12-31", "2026-01-02"):
        assert run_cli("data", "demo", "--as-of", day, "--tickers", "2", "--out",
                       str(data), env=env).code == 0
    done = run_cli("data", "show", "alph.demo", "--rows", "1", env=env)
    assert done.code == 0, done.stderr
    assert "last 1 of 240 sessions up to 2026-01-02" in done.stdout, done.stdout[:300]
    empty = run_cli("data", "show", "ALPH.DEMO",
                    env={"NIGHTDESK_DATA_DIR": str(tmp_path / "none")})
    assert empty.code == 2 and empty.error_lines[0].startswith(
        f"error: no snapshot under {tmp_path / 'none'}"), empty.stderr
