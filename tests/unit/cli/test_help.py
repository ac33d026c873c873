"""Every command's help reads cleanly: in its group's list each summary is one line, the
docstring's line breaks joined (typer's rich list kept them: `plan`, `ranking`, `changes`
and `server status` came out ragged), and its own page opens with that line whole.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
import typer
from typer._click import Command

from app.cli import app
from tests.unit.support.clirun import run_cli

WIDE = {"COLUMNS": "2000"}  # no summary is long enough to wrap at this width


def _commands(command: Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                            Command]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


ALL = list(_commands(typer.main.get_command(app)))
GROUPS = [(path, command) for path, command in ALL if getattr(command, "commands", None)]


def _summary(command: Command) -> str:
    return " ".join(inspect.cleandoc(command.help or "").split("\n\n")[0].split())


@pytest.mark.parametrize(("path", "group"), GROUPS, ids=[" ".join(p) or "nightdesk"
                                                         for p, _ in GROUPS])
def test_each_commands_summary_is_one_line_in_its_groups_list(
        path: tuple[str, ...], group: Command) -> None:
    done = run_cli(*path, "--help", env=WIDE)
    assert done.code == 0, done.stderr
    lines = done.stdout.splitlines()
    for name, sub in group.commands.items():  # type: ignore[attr-defined]
        row = next(line for line in lines if line.startswith(f"│ {name} "))
        assert _summary(sub) in row, (name, row)


@pytest.mark.parametrize(("path", "command"), ALL[1:], ids=[" ".join(p) for p, _ in ALL[1:]])
def test_each_commands_own_help_opens_with_its_summary_whole(
        path: tuple[str, ...], command: Command) -> None:
    done = run_cli(*path, "--help", env=WIDE)
    assert done.code == 0, done.stderr
    assert any(_summary(command) in line for line in done.stdout.splitlines()), path
