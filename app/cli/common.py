"""Share what every command needs: settings, logging and a database that is ready."""

from __future__ import annotations

from sqlalchemy import Engine

from app.batch.checkpoints import check_checkpoints
from app.config import Settings, get_settings
from app.db.engine import ready_engine
from app.logs import configure_logging


def setup(json_logs: bool = False) -> Settings:
    """Build settings (raising ConfigError on a bad value) and configure logging."""
    settings = get_settings()
    configure_logging("json" if json_logs else settings.log.format, settings.log.level)
    return settings


def database(settings: Settings) -> Engine:
    """Return an engine whose schema is current (migrations run first)."""
    return ready_engine(settings.store.database_url)


def batch_database(settings: Settings) -> Engine:
    """Return the engine for a command that runs batches: its checkpoint store opens too."""
    engine = database(settings)
    check_checkpoints(settings.store.database_url)
    return engine
