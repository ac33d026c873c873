"""``nightdesk notify test``: send a test message to every destination in NIGHTDESK_NOTIFY."""

from __future__ import annotations

import socket

import typer
from rich.markup import escape

from app.cli.common import setup
from app.cli.logs import console
from app.errors import ConfigError, NotifyError
from app.notify import Message, send, split_destinations

app = typer.Typer(no_args_is_help=True, help="The morning digest's destinations.")
err = console(stderr=True)


@app.command("test")
def test() -> None:
    """Send a test message to every NIGHTDESK_NOTIFY destination; exit 1 if one refused it."""
    settings = setup()
    urls = split_destinations(settings.notify.urls)
    if not urls:
        raise ConfigError("NIGHTDESK_NOTIFY is not set: give one or more Apprise URLs, "
                          "comma-separated (e.g. json://127.0.0.1:9000/hook)")
    delivery = send(settings.notify.urls, Message(
        "nightdesk: test message",
        f"A test from `nightdesk notify test` on {socket.gethostname()}: the morning digest "
        f"goes here after every nightly batch and rerun. Pages: {settings.web.base_url}/"),
        settings.notify.timeout_s, log_failures=False)  # printed once, here
    for destination, reason in delivery.failed.items():
        err.print(f"  not delivered: {escape(destination)}: {escape(reason)}")
    if delivery.failed:
        raise NotifyError(f"test message delivered to {delivery.sent} of {delivery.total} "
                          "destinations")
    err.print(f"test message delivered to {delivery.sent} of {delivery.total} destinations")
