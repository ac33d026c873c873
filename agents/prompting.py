"""Render the prompt files strictly and assemble messages whose prefix the server can cache."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

PROMPTS = Path(__file__).resolve().parent / "prompts"
SYSTEM_TEMPLATE = "_system.j2"
CONTEXT_TEMPLATE = "_context.j2"


@lru_cache(maxsize=1)
def environment() -> Environment:
    """Return the one Jinja environment: a missing variable raises, no HTML escaping, and a
    prompt file once read is kept for the process's life (a night renders the prompts it
    started with, whatever happens to the files meanwhile)."""
    return Environment(
        loader=FileSystemLoader(PROMPTS),
        # Not re-read when the file changes: a deploy under way or the disk's moment away
        # would otherwise fail the tickers rendering it then.
        auto_reload=False,
        undefined=StrictUndefined,
        autoescape=False,  # prompts are plain text, never HTML
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )


def render(name: str, **variables: Any) -> str:
    """Render one prompt file; raise jinja2.UndefinedError if a variable is missing."""
    return environment().get_template(name).render(**variables).strip()


def system_message() -> str:
    """Return the system message, identical for every node so it opens every cached prefix."""
    return render(SYSTEM_TEMPLATE)


def build_messages(kind: str, context: Mapping[str, Any], **variables: Any
                   ) -> list[dict[str, str]]:
    """Return [system, user] for a node kind: shared context first, then the node's own part.

    ``context`` feeds the shared context template and is also visible to the node's template;
    only the context part is shared across nodes, so its wording must not depend on ``kind``.
    """
    shared = render(CONTEXT_TEMPLATE, **context)
    own = render(f"{kind}.j2", **context, **variables)
    return [
        {"role": "system", "content": system_message()},
        {"role": "user", "content": f"{shared}\n\n{own}\n"},
    ]
