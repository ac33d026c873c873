"""A bad value for any typed option of any command: one line in nightdesk's words, exit 2.

Every option of every command whose value typer checks (a whole number, a number, one of a
few words) is given a value it refuses, read from the command tree itself so an option added
later is covered too. The line names the option and the value given, and carries none of
pydantic's wording ("Value error, ", "Input should be"). Each refusal comes while the
arguments are parsed, before the command's body, so nothing here runs a night or a server.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator

import pytest
import typer
from typer._click import Command

from app.cli import app
from tests.unit.support.clirun import run_cli


def typed_options() -> Iterator[tuple[list[str], str, object, int | None, int | None]]:
    """Yield (command path, option, its type, min, max) for every option typer checks."""
    def walk(command: typing.Any, path: list[str]) -> Iterator[tuple[list[str], typing.Any]]:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        else:
            for param in command.params:
                yield path, param

    for path, param in walk(typer.main.get_command(app), []):
        if param.param_type_name != "option" or param.is_flag:
            continue
        bare = param.type_descriptor.annotation
        if bare in (int, float) or typing.get_origin(bare) is typing.Literal:
            yield path, param.opts[0], bare, param.min, param.max


def refused_values(kind: object, low: int | None, high: int | None) -> list[str]:
    if typing.get_origin(kind) is typing.Literal:
        return ["nonesuch"]
    values = ["abc"]
    if low is not None:
        values.append(str(low - 1))
    if high is not None:
        values.append(str(high + 1))
    return values


CASES = [pytest.param([*path, option, value], id=f"{' '.join(path)} {option} {value}")
         for path, option, kind, low, high in typed_options()
         for value in refused_values(kind, low, high)]


def test_the_command_tree_has_typed_options_to_check() -> None:
    # A walk that found nothing would pass every case below by having none.
    options = {(" ".join(path), option) for path, option, *_ in typed_options()}
    assert {("ranking", "--format"), ("batches", "--limit"), ("web", "--port")} <= options


@pytest.mark.parametrize("argv", CASES)
def test_a_refused_option_value_is_one_line_in_nightdesks_words(argv: list[str]) -> None:
    result = run_cli(*argv)
    assert result.code == 2, (argv, result.code, result.stderr)
    [line] = result.stderr.splitlines()
    option, value = argv[-2], argv[-1]
    assert line.startswith("error: ") and option in line, line
    assert repr(value) in line, line  # the value given, quoted, so the operator sees it
    for wording in ("Value error", "Input should be", "Assertion failed", "unable to parse"):
        assert wording not in line, line
    assert result.stdout == ""


# Numbers a command checks itself, with a line of its own (finite, above 0).
CHECKED_IN_CODE = {"bench schedulers --scale", "bench schedulers --output-scale"}


def _numbers(command: Command, path: str = "") -> list[tuple[str, object, object, object]]:
    """Return (command and option, type, min, max) of every int or float option typer
    checks itself (not those with a parser of their own: batch ids, dates)."""
    found = []
    for param in command.params:
        described = param.type_descriptor  # type: ignore[attr-defined]
        if described.annotation in (int, float) and described.parameter_info.parser is None:
            found.append((f"{path} {param.opts[0]}".strip(), described.annotation, param.min,
                          param.max))  # type: ignore[attr-defined]
    for name, sub in getattr(command, "commands", {}).items():
        found += _numbers(sub, f"{path} {name}".strip())
    return found


def test_every_number_option_has_a_floor_and_every_whole_number_a_ceiling() -> None:
    # Unbounded, `batches --limit 99999999999999999999` reached SQLite (a traceback),
    # `server command --port -1` printed a command that cannot work, and a negative
    # --timeout or --rows was taken: 18 options lacked a bound.
    numbers = _numbers(typer.main.get_command(app))
    assert len(numbers) > 20  # the walk reached the subcommands
    assert [name for name, kind, low, high in numbers
            if (low is None or (kind is int and high is None))
            and name not in CHECKED_IN_CODE] == []


@pytest.mark.parametrize("argv", [
    ("batches", "--limit", "99999999999999999999"),  # was a traceback (SQLite INTEGER)
    ("server", "command", "--port", "-1"),  # was a command printed, exit 0
    ("data", "show", "ALPH.DEMO", "--rows", "-5"),  # was "last 0 of 240 sessions", exit 0
], ids=" ".join)
def test_a_number_past_its_bounds_is_refused_before_the_command_runs(
        argv: tuple[str, ...]) -> None:
    result = run_cli(*argv)
    assert result.code == 2, result.stdout
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ") and argv[-2] in line, line
    assert result.stdout == ""


@pytest.mark.parametrize("strategy", ["bogus", "fixed-0", "fixed-01", "adaptive:nonsense=1"])
@pytest.mark.parametrize("command", [["run"], ["run", "--continue-night"],
                                     ["replay", "--batch", "1"]])
def test_a_mistyped_strategy_is_named_before_the_server_or_the_data_are_asked(
        command: list[str], strategy: str) -> None:
    # No snapshot, no batch, no server: each would be a refusal of its own, said first.
    result = run_cli(*command, "--strategy", strategy,
                     env={"NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1"})
    assert result.code == 2, result.stderr
    [line] = result.error_lines
    assert line.startswith("error: ") and f"strategy {strategy!r}" in line, line


@pytest.mark.parametrize("given", [["--strategy", "fixed-3"], ["--strategy", "adaptive"],
                                   ["--samples", "2"]])
def test_resume_refuses_what_it_would_ignore(given: list[str]) -> None:
    # A resume keeps the batch's own shape; an option it would drop silently is refused.
    result = run_cli("run", "--resume", "1", *given)
    assert result.code == 2, result.stderr
    [line] = result.error_lines
    assert line == ("error: --resume continues a recorded batch with its own tickers, date, "
                    f"samples and strategy: drop {given[0]}"), line
