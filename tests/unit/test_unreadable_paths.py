"""A directory where a file is expected (a universe file, a bench JSON, NIGHTDESK_CONFIG):
one line that names the path once and says what is wrong in plain words, exit 2; never
Python's "[Errno 21] Is a directory: '/path'" after the path already named, nor "no such
file" for a directory that is there."""

from __future__ import annotations

from pathlib import Path

from tests.unit.support.clirun import run_cli


def test_a_directory_where_a_file_is_expected_is_said_once_in_plain_words(
        tmp_path: Path) -> None:
    said = {
        ("run", "--universe", str(tmp_path)): f"cannot read universe file {tmp_path}: "
                                              "Is a directory",
        ("bench", "combine", str(tmp_path)): f"cannot read bench JSON {tmp_path}: "
                                             "Is a directory",
    }
    for argv, line in said.items():
        done = run_cli(*argv)
        assert (done.code, done.error_lines) == (2, [f"error: {line}"])
    done = run_cli("ranking", env={"NIGHTDESK_CONFIG": str(tmp_path)})
    assert (done.code, done.error_lines) == (2, [
        f"error: invalid setting NIGHTDESK_CONFIG: {tmp_path} is a directory, not a TOML file"])
