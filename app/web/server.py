"""Build the web app: pages, JSON API, health check, auth, and the rerun queue it supervises."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.config import Settings, get_settings
from app.db.engine import SchemaWatch, check_reachable, no_connection, timed_out
from app.errors import DatabaseError, InputError
from app.morning.prometheus import night_registry
from app.web import api, pages, track
from app.web.auth import Guard
from app.web.reruns import RerunQueue
from app.web.state import WebState, require_user


def create_app(engine: Engine, guard: Guard, reruns: RerunQueue, *,
               stale_after_s: float, settings: Settings | None = None,
               schema: SchemaWatch | None = None) -> FastAPI:
    """Return the app; the rerun queue runs for as long as the app does (its lifespan).

    ``settings`` (default: ``get_settings()``) give the schedule the night's status reads;
    ``schema``: the process's watch of the schema's revision (default: the app's own), which
    the pages and ``/metrics`` read through.
    """
    schema = schema or SchemaWatch(engine)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with reruns:
            yield

    # No /docs or /redoc: FastAPI's pages load their scripts from a CDN, which an offline
    # GPU host cannot reach; the JSON API is described in docs/operations.md instead.
    app = FastAPI(title="nightdesk", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.web = WebState(engine=engine, guard=guard, reruns=reruns,
                             stale_after_s=stale_after_s,
                             settings=settings or get_settings())
    app.mount("/static", StaticFiles(packages=[("app.web", "static")]), name="static")
    app.include_router(pages.router)
    app.include_router(track.router)
    app.include_router(api.router)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        """Answer 200 when the database answers; no credentials, so monitors can ask."""
        try:
            await run_in_threadpool(check_reachable, engine)
        except DatabaseError:
            return JSONResponse({"status": "error", "database": "unreachable"}, 503)
        return JSONResponse({"status": "ok", "database": "ok"})

    registry = night_registry(engine, app.state.web.settings, schema)

    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(require_user)])
    def metrics() -> Response:
        """Answer Prometheus text read from the database (app.morning.prometheus), behind auth."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Any:
        """Answer API callers in JSON and browsers with a short page (never a traceback)."""
        headers = getattr(error, "headers", None)
        if request.url.path.startswith("/api/") or error.status_code == 401:
            return JSONResponse({"detail": error.detail}, error.status_code, headers=headers)
        return pages.templates.TemplateResponse(
            request, "missing.html", {"what": error.detail, "status": error.status_code},
            status_code=error.status_code, headers=headers)

    @app.exception_handler(DBAPIError)
    async def database_refused(request: Request, error: DBAPIError) -> Any:
        """Answer a page whose database refused its connection (``no_connection``: others
        hold them all) or cancelled its statement at its bound with 503 and that one line,
        as the CLI says it; any other database error is the server's (500)."""
        said = no_connection(error) or timed_out(error)
        if said is None:
            raise error
        return await http_error(request, StarletteHTTPException(503, said))

    @app.exception_handler(InputError)
    async def unknown(request: Request, error: InputError) -> Any:
        """Answer an id the read side does not find (the InputError a route lets through,
        e.g. no batch N) with 404 and its one line, as a page or as JSON."""
        return await http_error(request, StarletteHTTPException(404, str(error)))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, error: RequestValidationError) -> Any:
        """Answer a query or path value FastAPI cannot read with 400 and one line, as any
        other bad input (never 422 with the validator's dump)."""
        first = error.errors()[0] if error.errors() else {}
        where = str(first.get("loc", ["?"])[-1])
        detail = f"{where}: {first.get('msg', 'invalid value')} (got {first.get('input')!r})"
        return await http_error(request, StarletteHTTPException(400, detail))

    @app.middleware("http")
    async def schema_known(request: Request, call_next: Any) -> Any:
        """Answer 503 with ``SchemaTooNew``'s one line, not a route's traceback, once another
        host has migrated the database under this server to a revision it does not know
        (``schema``: one read at most every ``SCHEMA_CHECK_S``, app/db/engine.py)."""
        refused = await run_in_threadpool(schema.refusal) if schema.due() else schema.said
        if not refused:
            return await call_next(request)
        if request.url.path in ("/healthz", "/metrics"):
            return JSONResponse({"status": "error", "detail": refused}, 503)
        return await http_error(request, StarletteHTTPException(503, refused))

    return app
