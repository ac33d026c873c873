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


