"""A reader that closes the pipe early (`nightdesk ranking | head -1`) ends every command
quietly with 141, the status a shell gives a Unix tool killed by SIGPIPE: never typer's or
rich's exit 1 (a failed batch's code), never a traceback or "Exception ignored"; and a
command's own failure keeps its code when its error line meets a closed stderr.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from datetime import date, timedelta

import pytest
from sqlalchemy import Engine

from tests.unit.support.clirun import run_cli
from tests.unit.support.night_rows import Rated, add_night, at

TONIGHT = date(2026, 11, 27)
PIPE_CLOSED = 141  # app.cli.PIPE_CLOSED, spelt out: the shell's status for SIGPIPE, 128 + 13
# Every command that writes to stdout, in each of its formats.
OUTPUT = [("ranking", "--format", fmt) for fmt in ("table", "json", "csv")] + [
    ("changes", "--format", fmt) for fmt in ("table", "json", "csv")] + [
    ("batches", "--format", fmt) for fmt in ("table", "json", "csv")] + [
    ("report", "--format", fmt) for fmt in ("table", "json")] + [
    ("plan", "--tickers", "10", "--format", fmt) for fmt in ("table", "json", "csv")] + [
    ("quality", "repro", "--batches", "1,2", "--format", fmt) for fmt in ("table", "json")] + [
    ("report", "--compare", "1,2"),
    ("ranking", "--require-fresh"), ("--help",), ("ranking", "--help"), ("quality", "--help"),
    ("server", "command", "--profile", "cpu-tiny")]


class ClosedPipe(io.StringIO):
    """stdout whose reader is gone: every write and flush meets EPIPE, as on a real pipe."""

    def __init__(self) -> None:
        super().__init__()
        self._null = open(os.devnull, "w")  # noqa: SIM115 - rich points its fd at the null device

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        return self._null.fileno()


def _two_nights(engine: Engine) -> None:
    add_night(engine, TONIGHT - timedelta(days=1), at(TONIGHT, 0, 10) - timedelta(days=1),
              {"AAA": Rated("Buy", 0.6), "BBB": Rated("Hold", 0.0)})
    add_night(engine, TONIGHT, at(TONIGHT, 0, 10),
              {"AAA": Rated("Hold", 0.1), "BBB": Rated("Buy", 0.7)})


@pytest.mark.parametrize("argv", OUTPUT, ids=" ".join)
def test_every_output_command_ends_141_and_quiet_on_a_closed_pipe(
        sqlite_engine: Engine, argv: tuple[str, ...]) -> None:
    _two_nights(sqlite_engine)
    done = run_cli(*argv, stdout=ClosedPipe())
    assert done.code == PIPE_CLOSED, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert not any(line.startswith("error:") for line in done.error_lines)


def test_an_error_told_to_a_closed_stderr_keeps_its_code(sqlite_engine: Engine) -> None:
    _two_nights(sqlite_engine)
    code = run_cli("changes", "--batch", "99", stderr=ClosedPipe()).code
    assert code == 2  # "no batch with id 99": bad input, not rich's 1 nor a closed pipe's 141


@pytest.mark.parametrize("argv", [("ranking", "--format", "csv"), ("ranking",), ("--help",)],
                         ids=" ".join)
def test_the_real_process_exits_141_without_a_word_when_head_has_gone(
        sqlite_engine: Engine, sqlite_url: str, argv: tuple[str, ...]) -> None:
    _two_nights(sqlite_engine)
    child = subprocess.Popen(
        [sys.executable, "-c", "from app.cli import main; main()", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "NIGHTDESK_DATABASE_URL": sqlite_url})
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # the reader is gone before the first line is written
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=60) == PIPE_CLOSED, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert "error" not in stderr


def test_a_closed_pipe_leaves_the_next_command_in_the_process_its_output(
        sqlite_engine: Engine) -> None:
    # rich's own answer to a closed pipe left the module's console quiet for good: in one
    # process (a test session, the web's reruns) every later table came out empty.
    _two_nights(sqlite_engine)
    assert run_cli("ranking", stdout=ClosedPipe()).code == PIPE_CLOSED
    after = run_cli("ranking")
    assert after.code == 0 and "ranking of batch 2" in after.stdout, after.stderr


def test_a_reader_gone_from_stderr_leaves_the_command_its_output(sqlite_engine: Engine) -> None:
    # stderr carries notes and log lines, the command's product is on stdout: `ranking`
    # whose stderr reader went away still prints the ranking, then ends 141 (before, its
    # first note ended it with nothing printed).
    _two_nights(sqlite_engine)
    done = run_cli("ranking", stderr=ClosedPipe())
    assert done.code == PIPE_CLOSED
    assert "ranking of batch 2" in done.stdout
