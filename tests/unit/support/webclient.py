"""Open the web app on a test's database, as one signed-in operator would reach it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.config import Settings
from app.db.engine import SchemaWatch
from app.web.auth import Guard
from app.web.reruns import RerunQueue
from app.web.server import create_app

USER, PASSWORD = "operator", "s3cret-pass"
AUTH = (USER, PASSWORD)


@contextmanager
def web_client(engine: Engine, *, reruns: RerunQueue | None = None,
               settings: Settings | None = None, schema: SchemaWatch | None = None,
               raise_server_exceptions: bool = True) -> Iterator[TestClient]:
    """Yield a client of the app on ``engine``, guarded by AUTH, its lifespan running.

    ``reruns`` defaults to a queue running the real ``nightdesk rerun`` when a test asks for
    one; ``settings`` to the app's own (``get_settings()``); ``schema`` to the app's own watch;
    a server error raises in the test unless told otherwise.
    """
    app = create_app(engine, Guard(USER, PASSWORD), reruns or RerunQueue(),
                     stale_after_s=120.0, settings=settings, schema=schema)
    with TestClient(app, raise_server_exceptions=raise_server_exceptions) as client:
        yield client
