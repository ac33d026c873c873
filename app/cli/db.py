"""``nightdesk db``: schema management."""

from __future__ import annotations

import typer

from app.cli.common import setup
from app.cli.logs import console
from app.db.engine import upgrade as run_upgrade

app = typer.Typer(no_args_is_help=True, help="Database schema.")


@app.command()
def upgrade() -> None:
    """Upgrade the database schema to the newest migration."""
    settings = setup()
    run_upgrade(settings.store.database_url, settings.store.db_statement_timeout_s)
    console().print("database schema is current")
