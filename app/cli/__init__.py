"""Define the ``nightdesk`` command line: every command turns nightdesk errors into one line."""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
from collections.abc import Iterator
from typing import Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from sqlalchemy.exc import DBAPIError
from typer._click import Command, Context
from typer._click.exceptions import BadParameter, ClickException, NoSuchOption
from typer.core import TyperGroup

from app.cli import batch, bench, data, db, notify, plan, quality, report, scheduler, server, web
from app.cli.common import what_the_night_says
from app.cli.logs import (
    UNWRAPPED_WIDTH,
    console,
    full,
    hung_up,
    lose,
    lost_a_reader,
    lost_to_a_full_disk,
    reader_gone,
)
from app.db.engine import no_connection, timed_out
from app.db.readonly import refusal
from app.errors import ERRORS, DatabaseError, NoNightYet, validation_said
from serving.urls import redact

# A reader that closed the pipe early (`nightdesk ranking | head -1`): the exit status a shell
# gives any Unix tool killed by SIGPIPE (128 + 13), as git and cat end. Apart from every
# code of nightdesk's own (0-6, 130), and never 0: the output was cut short.
PIPE_CLOSED = 141


# stdout or stderr on a full disk (sysexits' EX_IOERR): the output is cut short, and
# apart from every code of nightdesk's own and from a closed pipe's.
OUTPUT_FULL = 74


class _PipeClosed(Exception):
    """stdout or stderr lost its reader. Not an OSError: typer turns an EPIPE into exit 1."""


class _OutputFull(Exception):
    """stdout's file could not grow (its disk full): the command's product is cut short."""


@contextlib.contextmanager
def _pipe_closes() -> Iterator[None]:
    try:
        yield
    except OSError as error:
        if hung_up(error):  # a closed pipe, or a terminal hung up
            raise _PipeClosed from error
        if full(error):
            raise _OutputFull(error.strerror) from error
        raise
    except SystemExit as exit_:
        # typer's help console (rich's own) exits 1 on a closed pipe: told by its cause.
        if exit_.__context__ is not None and hung_up(exit_.__context__):
            raise _PipeClosed from exit_.__context__
        if exit_.__context__ is not None and full(exit_.__context__):
            raise _OutputFull(getattr(exit_.__context__, "strerror", "")) from None
        raise


def _tree(command: Command) -> Iterator[Command]:
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _tree(sub)


def _flowed(text: str) -> str:
    """Return a docstring's help with each paragraph's line breaks joined, as prose flows:
    typer's rich page kept them ("...are refused" / "unless --allow-mixed." on two lines).
    A paragraph that opens with click's ``\\b`` keeps its lines as written."""
    return "\n\n".join(paragraph if paragraph.startswith("\b")
                       else re.sub(r"[ \t]*\n[ \t]*", " ", paragraph)
                       for paragraph in inspect.cleandoc(text).split("\n\n"))


class _Cli(TyperGroup):
    """The top-level group: every command's help flowing as paragraphs, its summary on one
    line, the page unwrapped off a terminal; a closed pipe met anywhere (a help page
    included) raised as ``_PipeClosed`` for ``main``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._helps = {command: _flowed(command.help) for command in _tree(self)
                       if command.help}
        for command, text in self._helps.items():
            command.short_help = command.short_help or text.split("\n\n")[0].strip("\b\n")

    def make_context(self, info_name: str | None, args: list[str], parent: Context | None = None,
                     **extra: Any) -> Context:
        # Off a terminal (a pipe, a file) every help page is click's plain text at the width
        # the commands' own output has (no box, no line folded at 80 columns, `\b` blocks
        # kept); on one, typer's rich page at the terminal's width.
        plain = not sys.stdout.isatty()
        for command in _tree(self):
            command.rich_markup_mode = None if plain else "rich"  # type: ignore[attr-defined]
            if command in self._helps:
                text = self._helps[command]
                command.help = text if plain else text.replace("\b\n", "")
        if plain:
            extra.setdefault("terminal_width", UNWRAPPED_WIDTH)
        with _pipe_closes():  # the top-level --help is printed here
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Context) -> Any:
        with _pipe_closes():
            return super().invoke(ctx)


app = typer.Typer(cls=_Cli, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False,
                  help="Nightly multi-agent stock analysis on a co-located vLLM server.")
app.add_typer(db.app, name="db")
app.add_typer(data.app, name="data")
app.add_typer(server.app, name="server")
app.add_typer(bench.app, name="bench")
app.add_typer(quality.app, name="quality")
app.add_typer(notify.app, name="notify")
app.command("report")(report.report)
app.command("batches")(report.batches)
app.command("preflight")(server.preflight)
app.command("web")(web.web)
app.command("scheduler")(scheduler.scheduler)
app.command("plan")(plan.plan)
batch.register(app)

err = console(stderr=True)


def main() -> None:
    """Run the CLI; any of nightdesk's errors prints one line and exits with its code. A
    reader gone from stdout ends the command quietly with PIPE_CLOSED; one gone from stderr
    (log lines, notes) ends nothing: the command goes on without it (a night is not lost to
    a pager closed), and ends with PIPE_CLOSED unless its own code said more than success."""
    lost_a_reader(forget=True)
    try:
        _main()
    except SystemExit as exit_:
        _flush()  # also where a failure exits: else the interpreter's is 120
        if exit_.code in (0, None) and lost_a_reader():
            sys.exit(PIPE_CLOSED)
        if exit_.code in (0, None) and lost_to_a_full_disk():
            sys.exit(OUTPUT_FULL)
        raise
    except (_PipeClosed, BrokenPipeError):  # also a line for stderr, told to a closed pipe
        _flush()
        sys.exit(PIPE_CLOSED)
    except _OutputFull as cut:
        # What was written is kept; what was not is lost to the disk, and the line says so
        # (on stderr, which may be on another disk).
        reader_gone(sys.stdout, filled=True)
        _flush()
        _tell(f"[bold red]error:[/] cannot write the output: {escape(str(cut))} (its disk "
              "is full); nothing the command records was lost")
        sys.exit(OUTPUT_FULL)


def _flush() -> None:
    """Flush stdout and stderr; one that has lost its reader is pointed at the null device,
    so the interpreter's last flush does not print "Exception ignored"."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError as error:
            lose(stream, error)


def _main() -> None:
    try:
        # Without standalone mode click returns a command's typer.Exit code instead of exiting.
        code = app(standalone_mode=False)
    except ERRORS as error:
        # Escaped: the message may quote input with [brackets] that rich would eat; redacted:
        # it may quote a URL, password and all.
        said = str(error) + (what_the_night_says() if isinstance(error, NoNightYet) else "")
        _tell(f"[bold red]error:[/] {escape(redact(said))}")
        sys.exit(error.exit_code)
    except DBAPIError as error:
        # A statement past its bound, or a write the database refuses: one line, as
        # DatabaseError.
        bound = timed_out(error) or refusal(error) or no_connection(error)
        if bound is None:
            raise
        _tell(f"[bold red]error:[/] {escape(bound)}")
        sys.exit(DatabaseError.exit_code)
    except KeyboardInterrupt:
        _tell("interrupted")
        sys.exit(130)
    except typer.Abort:
        sys.exit(1)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except ClickException as usage:  # bad options: one line, like every other input error
        where = getattr(getattr(usage, "ctx", None), "command_path", None)
        hint = f" (see `{where} --help`)" if where else ""
        message = redact(" ".join(_usage_message(usage).split()))
        _tell(f"[bold red]error:[/] {escape(message)}{hint}")
        sys.exit(usage.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


def _tell(line: str) -> None:
    """Print an error's line on stderr; one its reader closed leaves the error's exit code
    as it is."""
    try:
        err.print(line, highlight=False, soft_wrap=True)
    except OSError as error:  # stderr's gone or full too: the exit code is all that is left
        if not (hung_up(error) or full(error)):
            raise


def _usage_message(usage: ClickException) -> str:
    """Return a usage error's line. An option's value typer checked through pydantic is said
    in nightdesk's words with the value given, never pydantic's ("Value error, ", "Input
    should be ...")."""
    if isinstance(usage, NoSuchOption) and re.fullmatch(r"-\d+", usage.option_name):
        # `report -1`: click reads a negative number as an option, which no one meant.
        return (f"{usage.option_name} is no option, nor a batch id (a batch id is a whole "
                "number like 12)")
    cause = usage.__cause__
    if not (isinstance(usage, BadParameter) and isinstance(cause, ValidationError)):
        return usage.format_message()
    first = cause.errors()[0]
    said = validation_said(first)
    given = first.get("input")
    got = f" (got {given!r})" if isinstance(given, str | int | float) and \
        repr(given) not in said else ""
    usage.message = said.rstrip(".") + got
    return usage.format_message()
