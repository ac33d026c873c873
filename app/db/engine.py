"""Make the database engine and sessions, and bring the schema up to date with Alembic."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from app.errors import DatabaseError, SchemaOutdatedError
from serving.urls import redact


def reason(error: BaseException) -> str:
    """Return what went wrong, in one line and without a URL's password.

    SQLAlchemy's own text spans lines (the statement, a link); the driver's first line says it.
    """
    cause = getattr(error, "orig", None) or error
    lines = str(cause).strip().splitlines()
    return redact(lines[0] if lines else type(cause).__name__)


def make_engine(url: str) -> Engine:
    """Create an engine; a SQLite file gets its folder, WAL and foreign keys.

    A folder that cannot be made is a DatabaseError naming the database (one line).
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            folder = Path(parsed.database).parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise DatabaseError(f"cannot open database {redact(url)}: cannot make its "
                                    f"folder {folder}: {error.strerror or error}") from None
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):
            cursor = dbapi_conn.cursor()
            # WAL lets readers (report, ranking) read while the batch writes.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 5})


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    """Return one shared engine per URL."""
    return make_engine(url)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """Yield a session that commits on success and rolls back on error."""
    with session_factory(engine)() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def migrations_dir() -> Path:
    """Return the folder of the installed ``migrations`` package (Alembic's script location).

    Found through the package, not the source tree, so a wheel install has it too; Alembic
    needs a real folder, which an installed (unzipped) package always is.
    """
    return Path(str(files("migrations")))


def alembic_config(url: str) -> Config:
    """Build Alembic's configuration in code: no alembic.ini is needed at run time."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def check_reachable(engine: Engine) -> None:
    """Raise DatabaseError in one line when the database cannot be opened and read.

    Whatever the driver says: a host that does not answer, a refused login, a file that
    cannot be opened or is not a database at all.
    """
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (DBAPIError, OSError) as error:
        where = redact(engine.url.render_as_string(hide_password=False))
        raise DatabaseError(f"cannot reach database {where}: {reason(error)}") from None


# "0003_quality" was once the revision after "0003"; two revisions now come between them.
REORDERED = "0003_quality"
SKIPPED = ("0003", "0005_request_attempt")  # (before them, the last of them)


def _catch_up_reordered(conn: Connection, cfg: Config) -> None:
    """Run the revisions a database stamped ``0003_quality`` before the reordering lacks.

    Alembic takes such a database for current, though it has neither ``llm_calls``'
    context-trim columns nor ``llm_requests.attempt``: without this every usage row would
    fail to insert. Stamped back to before them, it runs just those, then is stamped again.
    """
    if MigrationContext.configure(conn).get_current_revision() != REORDERED:
        return
    if "context_trimmed" in {c["name"] for c in inspect(conn).get_columns("llm_calls")}:
        return
    before, last = SKIPPED
    command.stamp(cfg, before, purge=True)
    command.upgrade(cfg, last)
    command.stamp(cfg, REORDERED, purge=True)


def upgrade(url: str) -> None:
    """Upgrade the schema to the newest migration (idempotent)."""
    engine = get_engine(url)
    check_reachable(engine)
    try:
        with engine.begin() as conn:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            _catch_up_reordered(conn, cfg)
            command.upgrade(cfg, "head")
    except SQLAlchemyError as error:
        raise DatabaseError(f"migration failed: {reason(error)}") from None


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def require_current(url: str) -> Engine:
    """Return the engine, raising SchemaOutdatedError if migrations are pending."""
    engine = get_engine(url)
    check_reachable(engine)
    if current_revision(engine) != head_revision():
        raise SchemaOutdatedError("database schema is not current: run `nightdesk db upgrade`")
    return engine


def ready_engine(url: str) -> Engine:
    """Upgrade the schema if needed and return the engine: what every command calls first."""
    upgrade(url)
    return get_engine(url)
