"""``nightdesk db``: schema management."""

from __future__ import annotations

import typer

from app.cli.common import setup
from app.cli.logs import console
from app.db.engine import head_revision
from app.db.engine import upgrade as run_upgrade

app = typer.Typer(no_args_is_help=True, help="Database schema.")


@app.command()
def upgrade() -> None:
    """Upgrade the database schema to the newest migration; say whether it was created,
    upgraded (from which revision) or already current."""
    settings = setup()
    before = run_upgrade(settings.store.database_url, settings.store.db_statement_timeout_s)
    head = head_revision()
    if before is None:
        done = f"created at revision {head}"
    elif before == head:
        done = f"already current at revision {head}"
    else:
        done = f"upgraded from revision {before} to {head}"
    console().print(f"database schema {done}")
