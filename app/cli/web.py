"""``nightdesk web``: serve the ranking, ticker pages and batch reports over HTTP."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterator
from typing import Annotated

import typer
from sqlalchemy import Engine

from app.cli.common import database, setup
from app.config import Settings
from app.db.engine import SchemaWatch
from app.errors import ConfigError, InputError
from serving.errors import reason


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_listen(host: str, port: int) -> None:
    """Raise InputError (one line, exit 2) when ``host:port`` cannot be listened on: uvicorn
    would log its own lines and exit 3, which nightdesk's exit codes read as "partial"."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise InputError(f"--host {host}: not an address to listen on ({reason(error)})"
                         ) from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as error:
            raise InputError(f"--port {port}: cannot listen on {host}:{port} "
                             f"({error.strerror or error})") from None


# The example environment file's web password (deploy/nightdesk.env.example): served as
# is, the pages would open to anyone who has read the repository.
PLACEHOLDER = "change-me"


def web(
    host: Annotated[str, typer.Option("--host", help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8080,
    local_only: Annotated[bool, typer.Option(
        "--local-only", help="serve without a password; only on a loopback address")] = False,
    reruns: Annotated[int, typer.Option(
        "--reruns", min=1, max=8, help="reruns that may run at once")] = 1,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", min=1, max=65535,
        help="also serve /metrics without auth on 127.0.0.1:PORT (for a local Prometheus)")
    ] = None,
) -> None:
    """Serve the morning ranking, ticker pages (with Rerun) and batch reports."""
    settings = setup()
    password = settings.web.password.get_secret_value() if settings.web.password else ""
    if not password and not local_only:
        raise ConfigError("NIGHTDESK_WEB_PASSWORD is not set: set it (and NIGHTDESK_WEB_USER, "
                          "default 'nightdesk'), or pass --local-only to serve without one "
                          "on 127.0.0.1")
    if password == PLACEHOLDER:
        raise ConfigError(f"NIGHTDESK_WEB_PASSWORD is still the example environment file's "
                          f"{PLACEHOLDER!r}, which anyone with the repository knows: set one "
                          "of your own")
    if not password and not _loopback(host):
        raise InputError(f"--local-only serves without a password, so only on a loopback "
                         f"address, not {host}")
    if metrics_port == port:
        raise InputError(f"--metrics-port {metrics_port} is the pages' own --port: give another")
    _check_listen(host, port)
    # Imported here, not at the top: every other command would pay for FastAPI and matplotlib.
    import uvicorn

    from app.web.auth import Guard
    from app.web.reruns import RerunQueue
    from app.web.server import create_app

    engine = database(settings)
    schema = SchemaWatch(engine)  # one watch of the revision: the pages' and the port's
    # The reruns write where this server reads, whatever else their environment says.
    queue = RerunQueue(parallel=reruns, env={"NIGHTDESK_DATABASE_URL": settings.store.database_url})
    app = create_app(engine, Guard(settings.web.user, password or None), queue,
                     stale_after_s=settings.batch.heartbeat_stale_s, settings=settings,
                     schema=schema)
    with open_metrics_port(metrics_port, engine, settings, schema):
        typer.echo(f"nightdesk web on http://{host}:{port}/"
                   + ("" if password else " (no password: --local-only)"), err=True)
        # log_config=None: uvicorn's lines go through nightdesk's log (app/cli/logs.py), not
        # its own "INFO:     …" format.
        uvicorn.run(app, host=host, port=port, log_level=settings.log.level.lower(),
                    proxy_headers=False, log_config=None)


@contextlib.contextmanager
def open_metrics_port(port: int | None, engine: Engine, settings: Settings,
                      schema: SchemaWatch | None = None) -> Iterator[None]:
    """Serve /metrics without auth on 127.0.0.1:``port`` while open (None: not at all);
    ``schema``: the watch of the revision the pages read through too.

    Loopback only: a Prometheus on the same host scrapes it, nothing else can reach it.
    """
    if port is None:
        yield
        return
    from prometheus_client import start_http_server

    from app.morning.prometheus import night_registry

    try:
        server, thread = start_http_server(port, addr="127.0.0.1",
                                           registry=night_registry(engine, settings, schema))
    except OSError as error:
        raise InputError(f"--metrics-port {port}: cannot listen on 127.0.0.1:{port} "
                         f"({error.strerror or error})") from None
    typer.echo(f"metrics on http://127.0.0.1:{port}/metrics (no auth, loopback only)", err=True)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
