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
