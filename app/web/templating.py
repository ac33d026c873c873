"""Load the page templates from the installed package and give them a few formats (``fmt``
and ``counted``: app/morning/numbers.py, as the CLI's tables)."""

from __future__ import annotations

import re
from datetime import datetime

from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from app.morning.nightstatus import interval as eta_interval
from app.morning.nightstatus import span as duration
from app.morning.numbers import counted, number
from app.morning.ranking import RATING_ORDER


def when(value: str | None) -> str:
    """Show a stored ISO timestamp as ``YYYY-MM-DD HH:MM:SS UTC``."""
    if not value:
        return "—"
    return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S UTC")


# In the status lines the CLI prints as text: a batch named, and `a command`.
_BATCH = re.compile(r"\b(batch|rerun) #(\d+)")
_CODE = re.compile(r"`([^`]+)`")


def prose(text: str | None) -> Markup:
    """Show a status line as HTML: each "batch #N" a link to its page, `…` as code."""
    html = str(escape(text or ""))
    html = _BATCH.sub(r'<a href="/batches/\2">\1 #\2</a>', html)
    return Markup(_CODE.sub(r"<code>\1</code>", html))


def make_templates() -> Jinja2Templates:
    """Return the templates shipped in ``app/web/templates`` (found through the package)."""
    env = Environment(loader=PackageLoader("app.web", "templates"),
                      autoescape=select_autoescape(["html"]), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(fmt=number, when=when, duration=duration, prose=prose,
                       counted=counted)
    env.globals.update(RATING_ORDER=RATING_ORDER, eta_interval=eta_interval)
    return Jinja2Templates(env=env)
