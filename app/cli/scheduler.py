"""``nightdesk scheduler``: the long-running daemon that fires the nightly batch on schedule."""

from __future__ import annotations

from app.cli.common import batch_database, setup


def scheduler() -> None:
    """Run the nightly batch on NIGHTDESK_SCHEDULE_CRON until SIGTERM (the systemd service)."""
    from app.runs.daemon import NightlyDaemon

    settings = setup()
    NightlyDaemon(settings, batch_database(settings)).serve()
