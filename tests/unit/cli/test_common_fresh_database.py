"""A read command that finds no database says where it looked, not only "no night yet".

A mistyped NIGHTDESK_HOME or database URL points nightdesk at a file that is not there: it is
created empty (as for a first ``nightdesk run``), and the answer "no batches recorded yet"
would send the operator after nights that did run. Stderr names the file once, when made.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.support.clirun import run_cli


@pytest.mark.parametrize("command", ["ranking", "batches", "changes", "report"])
def test_a_read_command_names_the_database_it_had_to_create(tmp_path: Path,
                                                           command: str) -> None:
    home = tmp_path / "mistyped"
    env = {"NIGHTDESK_HOME": str(home)}
    first = run_cli(command, env=env)
    [note] = [line for line in first.stderr.splitlines() if line.startswith("note: ")]
    assert note.startswith(f"note: no database was at {home / 'nightdesk.db'}: created an "
                           "empty one"), note
    assert "Traceback" not in first.stderr
    again = run_cli(command, env=env)  # it is there now: nothing more to say
    assert not [line for line in again.stderr.splitlines() if line.startswith("note: ")]
    assert again.code == first.code


def test_a_database_that_is_there_gets_no_note(sqlite_engine: object) -> None:
    result = run_cli("batches")
    assert "note: " not in result.stderr, result.stderr
