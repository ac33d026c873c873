"""``nightdesk run / rerun / ranking / replay``: filled by the pipeline and batch issues."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the batch commands to the top-level app."""
