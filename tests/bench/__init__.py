"""Simulation benches: nightdesk against fake servers, run from a checkout, never installed.

``make bench-tracker`` and ``make bench-fleet`` run them as ``python -m tests.bench.tracker``
and ``python -m tests.bench.fleet``; they live here, beside the fakes they need, so the wheel
carries no fake server. ``run`` gives each the ``nightdesk`` command line's error contract.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from app.errors import ERRORS
from serving.urls import redact


def run(app: typer.Typer) -> None:
    """Run a bench's command line; a nightdesk error prints one line and exits with its code."""
    try:
        app(standalone_mode=False)
    except ERRORS as error:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(redact(str(error)))}",
                                   highlight=False, soft_wrap=True)
        sys.exit(error.exit_code)
