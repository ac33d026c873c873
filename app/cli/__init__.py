"""Define the ``nightdesk`` command line: every command turns nightdesk errors into one line."""

from __future__ import annotations

import re
import sys

import typer
from pydantic import ValidationError
from rich.markup import escape
from sqlalchemy.exc import DBAPIError
from typer._click.exceptions import BadParameter, ClickException, NoSuchOption

from app.cli import batch, bench, data, db, notify, plan, quality, report, scheduler, server, web
from app.cli.common import what_the_night_says
from app.cli.logs import console
from app.db.engine import timed_out
from app.errors import ERRORS, DatabaseError, NoNightYet, validation_said
from serving.urls import redact

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
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
    """Run the CLI; any of nightdesk's errors prints one line and exits with its code."""
    try:
        # Without standalone mode click returns a command's typer.Exit code instead of exiting.
        code = app(standalone_mode=False)
    except ERRORS as error:
        # Escaped: the message may quote input with [brackets] that rich would eat; redacted:
        # it may quote a URL, password and all.
        said = str(error) + (what_the_night_says() if isinstance(error, NoNightYet) else "")
        err.print(f"[bold red]error:[/] {escape(redact(said))}", highlight=False,
                  soft_wrap=True)
        sys.exit(error.exit_code)
    except DBAPIError as error:
        bound = timed_out(error)  # a statement past its bound: one line, as DatabaseError
        if bound is None:
            raise
        err.print(f"[bold red]error:[/] {escape(bound)}", highlight=False, soft_wrap=True)
        sys.exit(DatabaseError.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except typer.Abort:
        sys.exit(1)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except ClickException as usage:  # bad options: one line, like every other input error
        where = getattr(getattr(usage, "ctx", None), "command_path", None)
        hint = f" (see `{where} --help`)" if where else ""
        message = redact(" ".join(_usage_message(usage).split()))
        err.print(f"[bold red]error:[/] {escape(message)}{hint}", highlight=False,
                  soft_wrap=True)
        sys.exit(usage.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


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
