"""Bad input to any command is one line, `error: ...`, and exit 2, before anything runs.

The classes the eighth outside pass of issue 42 found: a whole number past any bound (a
traceback from SQLite), a negative port or timeout taken (a server command printed that
cannot work), a ticker or date without data exiting 1 (a failed batch's code), and an
unreadable file said with Python's "[Errno 21] ...: '/path'" after the path already named.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer._click import Command

from app.cli import app
from tests.unit.support.clirun import run_cli

# Floats whose command checks them itself, with a line of its own (finite, above 0).
CHECKED_IN_CODE = {"nightdesk bench schedulers --scale",
                   "nightdesk bench schedulers --output-scale"}


def _options(command: Command, path: str) -> list[tuple[str, type, object, object]]:
    found = []
    for param in command.params:
        described = getattr(param, "type_descriptor", None)
        if described is None or described.parameter_info.parser is not None:
            continue  # a parser of its own (batch ids, dates) says its bounds
        if described.annotation in (int, float):
            name = f"{path} {param.opts[0]}" if param.opts else f"{path} {param.name}"
            found.append((name, described.annotation, param.min, param.max))
    for name, sub in getattr(command, "commands", {}).items():
        found += _options(sub, f"{path} {name}")
    return found


def test_every_whole_number_option_has_both_bounds_and_every_number_a_floor() -> None:
    options = _options(typer.main.get_command(app), "nightdesk")
    assert len(options) > 20  # the walk reached the subcommands
    unbounded = [name for name, kind, low, high in options
                 if (low is None or (kind is int and high is None))
                 and name not in CHECKED_IN_CODE]
    assert unbounded == []


@pytest.mark.parametrize("argv", [
    ("batches", "--limit", "99999999999999999999"),  # was a traceback (SQLite INTEGER)
    ("server", "command", "--port", "-1"),  # was a command printed, exit 0
    ("server", "stop", "--timeout", "-5"),
    ("data", "show", "ALPH.DEMO", "--rows", "-5"),  # was "last 0 of 240 sessions", exit 0
], ids=" ".join)
def test_a_number_out_of_bounds_is_one_line_and_exit_2(sqlite_engine: object,
                                                       argv: tuple[str, ...]) -> None:
    done = run_cli(*argv)
    assert done.code == 2, done.stdout
    assert len(done.error_lines) == 1 and done.error_lines[0].startswith("error: "), done.stderr
    assert done.stdout == ""


def test_data_show_of_a_ticker_or_date_without_data_is_bad_input(demo_dir: Path) -> None:
    env = {"NIGHTDESK_DATA_DIR": str(demo_dir)}
    for argv in (("NOPE.DEMO",), ("ALPH.DEMO", "--as-of", "2020-01-02")):
        done = run_cli("data", "show", *argv, env=env)
        assert done.code == 2, done.stderr  # as `run` refuses it; 1 is a failed batch's
        assert done.error_lines[0].startswith("error: ") and len(done.error_lines) == 1


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
