"""Share what every command needs: settings, logging and a database that is ready."""

from __future__ import annotations

import contextlib
import csv
import json
import sys
import tempfile
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic_core import to_jsonable_python
from rich.markup import escape
from rich.table import Table
from sqlalchemy import Engine, make_url
from sqlalchemy.exc import DBAPIError

from app.cli.logs import configure_logging, console
from app.config import Settings, get_settings
from app.db.engine import ready_engine, reason
from app.db.readonly import refuses_writes
from app.db.retry import READ_WAIT_S
from app.errors import InputError
from app.morning.advice import Advice, advise
from app.morning.nightstatus import night_status
from app.morning.summary import Seen
from app.runs.checkpoints import check_checkpoints
from app.runs.resumable import mark_stale_crashed

# The --format option of the read commands: JSON and CSV for scripts, a table for people.
Formats = Annotated[Literal["table", "json", "csv"], typer.Option("--format")]
TableOrJson = Annotated[Literal["table", "json"], typer.Option("--format")]

# A count of tickers (``plan --tickers``, ``bench schedulers --tickers``): past every
# exchange's listings together. Unbounded, a count past float's range (10^400) ended in an
# OverflowError inside the model, and a large one built a workload of that many tickers.
MAX_TICKERS = 1_000_000
# Any other count an option takes (batches listed, rows, runs, nights, days): past any real
# one. Unbounded, 10^20 ended in a traceback ("Python int too large to convert to SQLite
# INTEGER"); every whole-number option has both bounds (tests/unit/cli/test_option_bounds.py).
MAX_COUNT = 1_000_000


def ticker_count(help: str) -> Any:
    """Return the ``--tickers N`` option of a count of tickers: 1 to MAX_TICKERS, one line
    otherwise."""
    return typer.Option("--tickers", min=1, max=MAX_TICKERS, help=help)


def setup(json_logs: bool = False) -> Settings:
    """Build settings (raising ConfigError on a bad value) and configure logging."""
    settings = get_settings()
    configure_logging("json" if json_logs else settings.log.format, settings.log.level)
    return settings


def database(settings: Settings) -> Engine:
    """Return an engine whose schema is current (migrations run first). A SQLite file that
    was not there is created empty, and stderr says where: a mistyped NIGHTDESK_HOME or
    database URL would otherwise read as "no night yet"."""
    url = settings.store.database_url
    path = make_url(url).database if url.startswith("sqlite") else None
    fresh = bool(path) and path != ":memory:" and not Path(str(path)).exists()
    # A server with no connection left is waited for a little (``READ_WAIT_S``).
    engine = ready_engine(url, settings.store.db_statement_timeout_s, READ_WAIT_S, "")
    if fresh:
        console(stderr=True).print(
            f"note: no database was at {escape(str(path))}: created an empty one "
            "(NIGHTDESK_DATABASE_URL, else NIGHTDESK_HOME, says where it is)", soft_wrap=True)
    return engine


def what_the_night_says() -> str:
    """Return, for a command that found no night to read (``NoNightYet``), what the morning's
    status says of the latest night and advises (the page's banner, in a clause):
    ``; no night has run yet: …; next: `nightdesk run` (…)``. Empty when it cannot be read."""
    try:
        settings = get_settings()
        night = night_status(ready_engine(settings.store.database_url,
                                          settings.store.db_statement_timeout_s), settings, None)
    except Exception:  # the error being told is the news; this is a hint
        return ""
    return (f"; {night.reason}" if night.reason else "") + next_clause(night.advice)


def next_clause(advice: list[Advice]) -> str:
    """Say advice in a clause after a line: ``; next: `cmd` (does); …``, empty without any."""
    steps = "; ".join(f"`{step.command}` ({step.does})" for step in advice)
    return f"; next: {steps}" if steps else ""


def batch_database(settings: Settings) -> Engine:
    """Return the engine for a command that runs batches: its checkpoint store opens too.
    (A first night creates its database: no note, as there is no night to miss yet.) A
    database that answers it takes no connection now is waited for within the write budget,
    as a write of the night would be."""
    store = settings.store
    engine = ready_engine(store.database_url, store.db_statement_timeout_s,
                          store.db_write_budget_s)
    check_checkpoints(settings.store.database_url)
    return engine


def mark_crashed(engine: Engine, stale_s: float, *, read_only_ok: bool = False,
                 seen: Seen | None = None) -> None:
    """Mark batches whose process died crashed, each with a note and its next step on stderr.

    ``read_only_ok`` (read commands): a database that takes no writes is read as is, and a
    note says what was left out; otherwise its error is raised. ``seen``: the command's
    (``app.morning.summary.Seen``), so that it reads the nightly lock once.
    """
    err = console(stderr=True)
    seen = seen or Seen(engine)
    try:
        crashed = mark_stale_crashed(engine, stale_s, seen)
    except DBAPIError as error:
        if not (read_only_ok and refuses_writes(error)):
            raise
        err.print(f"note: a batch with no heartbeat for over {stale_s:.0f} s (its process died)"
                  f" reads crashed but stays `running` in its row: the database takes no"
                  f" writes now ({reason(error)})", markup=False)
        return
    for batch_id in crashed:
        steps = advise(engine, batch_id, stale_s, seen)
        err.print(f"note: batch {batch_id} had no sign of life for over {stale_s:.0f} s: marked "
                  f"crashed" + (f" ({escape(steps)})" if steps else ""))


def echo_json(value: object, schema: str | None = None) -> None:
    """Print a value (models, dataclasses and all) as indented JSON on stdout; ``schema``
    (``"plan/1"``: the output and its version, docs/operations.md "Machine-readable output")
    leads the object."""
    data = to_jsonable_python(value)
    typer.echo(json.dumps({"schema": schema, **data} if schema else data, indent=2))


def echo_csv(rows: Iterable[Mapping[str, Any]], fields: Iterable[str]) -> None:
    """Print rows as CSV on stdout, a header line of ``fields`` first."""
    writer = csv.DictWriter(sys.stdout, fieldnames=list(fields))
    writer.writeheader()
    writer.writerows(rows)


def _cell(value: Any) -> Any:
    """Return a value as one CSV cell: a list of words joined by "; ", any other list or
    object as its JSON text, None as empty."""
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return "; ".join(value)
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return value


def csv_of(value: object, rows: str | None = None, *, lead: Iterable[str] = (),
           prefixes: Mapping[str, str] | None = None,
           renamed: Mapping[str, str] | None = None, left: Collection[str] = ()
           ) -> list[dict[str, Any]]:
    """Return what ``echo_json`` prints of ``value`` as CSV rows, so that a CSV carries every
    fact its JSON does: each item of the object's list ``rows`` (``value`` itself when it
    is a list) and on each every other fact of the object, an object's keys one level down
    as ``parent_key`` (``prefixes`` gives another word for ``parent``), ``renamed`` the
    names kept from before; deeper objects and lists are one cell (``_cell``). ``lead``:
    the columns first; ``left``: the object's keys the rows stand for (a list of which the
    rows are a part). ValueError where two facts would share a column."""
    data = to_jsonable_python(value)
    items = data if rows is None else data[rows]
    facts = _facts(data, rows, prefixes, renamed, left)
    out = []
    for item in items:
        row = {key: _cell(cell) for key, cell in item.items()}
        if clash := row.keys() & facts.keys():
            raise ValueError(f"CSV columns given twice: {sorted(clash)}")
        row |= facts
        out.append({**{key: row[key] for key in lead}, **row})
    return out


def csv_columns(value: object, rows: str, keys: Iterable[str], *, lead: Iterable[str] = (),
                left: Collection[str] = ()) -> list[str]:
    """Return the header ``csv_of``'s rows of ``value`` have, rows or none: ``lead``, the
    other ``keys`` of an item, then the object's facts; a script meets one header whether
    tonight has rows (changes) or not."""
    lead = list(lead)
    facts = _facts(to_jsonable_python(value), rows, None, None, left)
    return lead + [key for key in keys if key not in lead] + list(facts)


def _facts(data: dict[str, Any], rows: str | None, prefixes: Mapping[str, str] | None,
           renamed: Mapping[str, str] | None, left: Collection[str]) -> dict[str, Any]:
    """Return the object's facts besides its rows, as ``csv_of`` puts them on each row."""
    facts: dict[str, Any] = {}
    for key, fact in ({} if rows is None else data).items():
        if key == rows or key in left:
            continue
        parts = fact.items() if isinstance(fact, dict) else [(None, fact)]
        for inner, part in parts:
            name = key if inner is None else f"{(prefixes or {}).get(key, key)}_{inner}"
            facts[(renamed or {}).get(name, name)] = _cell(part)
    return facts


def writable(path: Path | None, option: str = "--json-out", *, folder: bool = False) -> None:
    """Raise InputError unless ``path`` (when given) can be written: a file, or with
    ``folder`` a folder to write files in. Checked before a run of minutes or hours, whose
    figures would otherwise be lost to a traceback at its end, and before anything is
    written. Nothing the check made (the file, the folders on its way) is left behind."""
    if path is None:
        return
    if folder and path.exists() and not path.is_dir():
        raise InputError(f"{option} {path}: cannot write there (Not a directory)")
    into = path if folder else path.parent
    made = [p for p in (into, *into.parents) if not p.exists()]  # the deepest first
    existed = path.exists()
    try:
        into.mkdir(parents=True, exist_ok=True)
        if folder:
            with tempfile.TemporaryFile(dir=path):
                pass
        else:
            with path.open("a"):
                pass
    except OSError as error:
        raise InputError(f"{option} {path}: cannot write there ({error.strerror})") from None
    finally:
        for left in ([] if existed or folder else [path.unlink]) + [p.rmdir for p in made]:
            with contextlib.suppress(OSError):
                left()


def figures(title: str, columns: Iterable[str], left: Collection[str] = ()) -> Table:
    """Return an empty table of these columns: figures right-justified, those in ``left``
    (names, labels) left-justified."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column in left else "right")
    return table
