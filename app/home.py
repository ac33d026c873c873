"""Decide where nightdesk keeps its files when ``NIGHTDESK_HOME`` does not say.

The rule: when the working directory is a nightdesk checkout (it holds a ``pyproject.toml``
whose ``[project] name`` is ``nightdesk``), the home is ``./var`` there, where ``make run`` has
always kept the database, the snapshots, the model and the server's files. Anywhere else the
program runs as an installed package and uses the user's data directory: on Linux
``$XDG_DATA_HOME/nightdesk``, by default ``~/.local/share/nightdesk``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import platformdirs

PROJECT = "nightdesk"
CHECKOUT_HOME = Path("var")
"""The home inside a checkout, relative to it (the working directory)."""
CHECKOUT_VLLM_VENV = Path(".venv-vllm")
"""Where ``make`` builds the CPU server's environment in a checkout."""


def in_checkout(cwd: Path | None = None) -> bool:
    """Tell whether ``cwd`` (default: the working directory) is a nightdesk checkout."""
    pyproject = (cwd or Path.cwd()) / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    project = data.get("project")
    return isinstance(project, dict) and project.get("name") == PROJECT


def default_home(cwd: Path | None = None) -> Path:
    """Return the data home to use when none is set: ``./var`` in a checkout, else per user."""
    if in_checkout(cwd):
        return CHECKOUT_HOME
    return Path(platformdirs.user_data_dir(PROJECT, appauthor=False))


def default_vllm_venv(home: Path, cwd: Path | None = None) -> Path:
    """Return the CPU server's virtual environment: ``./.venv-vllm`` in a checkout, else in home."""
    return CHECKOUT_VLLM_VENV if in_checkout(cwd) else home / "venv-vllm"


def unwritable(path: Path) -> str | None:
    """Return why ``path`` (a folder, or the nearest one above it that exists, where it would
    be made) takes no new file, in words for a line; None when it does. Read from the mount's
    flags and the user's rights (``access``): nothing is written to find out."""
    folder = next((p for p in (path, *path.parents) if p.exists()), path)
    if os.access(folder, os.W_OK):
        return None
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return f"{folder} is on a read-only filesystem"
    return f"{folder} is not writable by this user"
