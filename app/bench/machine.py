"""Where a bench's figures came from: the machine, the Python and the code's commit."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

from pydantic import BaseModel


class HostFacts(BaseModel, frozen=True):
    """Where a bench ran: CPU model, cores, Python, platform, host name and code commit."""

    cpu_model: str
    cores: int | None
    python: str
    platform: str
    host: str
    commit: str


def machine_facts() -> HostFacts:
    """Describe where the figures came from: CPU model (as lscpu names it), cores, Python."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return HostFacts(cpu_model=model, cores=os.cpu_count(), python=platform.python_version(),
                     platform=platform.platform(), host=platform.node(), commit=code_version())


def code_version() -> str:
    """Return the code's commit (``+dirty`` when tracked files differ from it) in a checkout,
    else the installed package's version."""
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            def git(*args: str) -> str:
                return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                      text=True, timeout=10, check=True).stdout.strip()
            dirty = git("status", "--porcelain", "--untracked-files=no")
            return git("rev-parse", "HEAD") + ("+dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            pass  # no git here: the package's version says what it can
    try:
        return f"nightdesk {importlib.metadata.version('nightdesk')}"
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
