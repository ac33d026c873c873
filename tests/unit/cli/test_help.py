"""Every command's help reads cleanly, for every command in the tree: in its group's list
each summary is one line; its own page flows each paragraph of its docstring as one (typer's
rich page kept the docstring's line breaks: `bench combine --help` showed "...are refused" /
"unless --allow-mixed." on two lines); off a terminal no page folds at 80 columns (the
commands' own output never did), and a ``\\b`` block keeps its lines.
"""

from __future__ import annotations

import inspect
import io
import re
from collections.abc import Iterator

import pytest
import typer
from typer._click import Command

from app.cli import app
from tests.unit.support.clirun import run_cli

WIDE = {"COLUMNS": "2000"}  # a terminal no summary or paragraph fills
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _commands(command: Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                            Command]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


ALL = list(_commands(typer.main.get_command(app)))
GROUPS = [(path, command) for path, command in ALL if getattr(command, "commands", None)]
IDS = [" ".join(p) or "nightdesk" for p, _ in ALL]


def _paragraphs(text: str | None) -> list[str]:
    """Return the docstring's paragraphs as prose reads them: each one's lines joined."""
    return [" ".join(p.split()) for p in inspect.cleandoc(text or "").split("\n\n")]


def _summary(command: Command) -> str:
    return _paragraphs(command.help)[0]


class Terminal(io.StringIO):
    """stdout that is a terminal; what it is given, read without its colours."""

    def isatty(self) -> bool:
        return True

    def getvalue(self) -> str:
        return ANSI.sub("", super().getvalue())


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # off a terminal the width is nightdesk's


@pytest.mark.parametrize(("path", "group"), GROUPS, ids=[" ".join(p) or "nightdesk"
                                                         for p, _ in GROUPS])
def test_each_commands_summary_is_one_line_in_its_groups_list(
        path: tuple[str, ...], group: Command) -> None:
    for done in (run_cli(*path, "--help"), run_cli(*path, "--help", env=WIDE,
                                                   stdout=Terminal())):
        assert done.code == 0, done.stderr
        for name, sub in group.commands.items():  # type: ignore[attr-defined]
            row = next(line for line in done.stdout.splitlines()
                       if line.strip(" │").startswith(f"{name} "))
            assert _summary(sub) in row, (name, row)


@pytest.mark.parametrize(("path", "command"), ALL, ids=IDS)
def test_each_commands_own_page_flows_every_paragraph_on_a_terminal(
        path: tuple[str, ...], command: Command) -> None:
    done = run_cli(*path, "--help", env=WIDE, stdout=Terminal())
    assert done.code == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    for paragraph in _paragraphs(command.help):
        assert paragraph in lines, (path, paragraph)


@pytest.mark.parametrize(("path", "command"), ALL, ids=IDS)
def test_each_commands_own_page_is_unwrapped_off_a_terminal(
        path: tuple[str, ...], command: Command) -> None:
    done = run_cli(*path, "--help")
    assert done.code == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    for paragraph in _paragraphs(command.help):
        assert paragraph in lines, (path, paragraph)
    for param in command.params:  # every option's and argument's help whole on its line
        said = " ".join(str(getattr(param, "help", "") or "").split())
        if said:
            assert any(said in line for line in lines), (path, param.name, said)
    assert not any(re.match(r"[╭│╰]", line) for line in lines), path  # plain text, no boxes


def test_a_block_marked_b_keeps_its_lines_and_the_prose_around_it_flows() -> None:
    demo = typer.Typer(cls=type(typer.main.get_command(app)), add_completion=False)

    @demo.command()
    def first() -> None:
        """Do the first
        thing.

        \b
        nightdesk run
        nightdesk ranking

        Then the prose
        flows again.
        """

    @demo.command()
    def second() -> None:
        """Do the second thing."""

    for stdout, env in ((io.StringIO(), {}), (Terminal(), WIDE)):
        with pytest.raises(SystemExit) as exit_, pytest.MonkeyPatch.context() as patch:
            patch.setattr("sys.stdout", stdout)
            for key, value in env.items():
                patch.setenv(key, value)
            demo(["first", "--help"], prog_name="demo")
        assert exit_.value.code == 0
        lines = [line.strip() for line in stdout.getvalue().splitlines()]
        start = lines.index("nightdesk run")
        assert lines[start:start + 2] == ["nightdesk run", "nightdesk ranking"], lines
        assert "Do the first thing." in lines and "Then the prose flows again." in lines, lines
