"""Isolate every test from the developer's environment and settings cache."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from sqlalchemy import Engine

from agents.data.demo import DEMO_AS_OF, write_demo
from app.config import get_settings
from app.db.engine import get_engine, upgrade

# rich fixes a console's width from COLUMNS when the console is built, and app.cli builds its
# consoles at import. A pytest-xdist worker starts with COLUMNS=80 in its environment, which
# would then override the width a test asks for (run_cli's env); without it, each print
# reads the width afresh.
os.environ.pop("COLUMNS", None)


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("NIGHTDESK_") and not key.startswith("NIGHTDESK_TEST_"):
            monkeypatch.delenv(key)
    # Nor a runtime directory of this shell's (app.usage.spare_place): a test sets its own.
    for key in ("RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(key, raising=False)
    # Every runtime path derives from the home: the database, snapshots, server files.
    monkeypatch.setenv("NIGHTDESK_HOME", str(tmp_path))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
    structlog.reset_defaults()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/nightdesk.db"


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a blank SQLite file upgraded to the newest migration, made once per process."""
    path = tmp_path_factory.mktemp("migrated") / "nightdesk.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    get_engine(url).dispose()  # every write is in the file before it is copied
    return path


@pytest.fixture
def sqlite_engine(sqlite_url: str, migrated_sqlite: Path) -> Engine:
    """Return an engine on a blank SQLite file upgraded to the newest migration."""
    # A copy of the migrated file: the same schema and alembic stamp as upgrading anew,
    # without running every migration again for each of the ~700 tests that ask.
    shutil.copyfile(migrated_sqlite, sqlite_url.removeprefix("sqlite:///"))
    return get_engine(sqlite_url)


@pytest.fixture
def demo_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Return a data folder holding the DEMO snapshot of DEMO_AS_OF's first three tickers,
    or of the first n where the test or its module is marked ``demo_tickers(n)``."""
    # The count matters where a night takes the snapshot's whole list (a daemon's night, a
    # run without --tickers) or a test asks for more than three; elsewhere tests name theirs.
    mark = request.node.get_closest_marker("demo_tickers")
    write_demo(tmp_path / "data", DEMO_AS_OF, mark.args[0] if mark else 3)
    return tmp_path / "data"
