"""Where a bench's figures came from: the machine, the Python and the code's commit."""

from __future__ import annotations

import contextlib
import hashlib
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


CHECKOUT = Path(__file__).resolve().parents[2]


def code_version(root: Path = CHECKOUT) -> str:
    """Return the code's commit in a checkout, else the installed package's version. Where
    tracked files differ from the commit, ``+dirty-`` and the first 12 hex digits of their
    diff's SHA-256: two runs of one commit with other edits must not read as the same code
    (``bench combine`` refuses runs of different code)."""
    if (root / ".git").exists():
        try:
            def git(*args: str) -> str:
                return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                      text=True, timeout=10, check=True).stdout
            diff = git("diff", "HEAD", "--no-ext-diff", "--binary")
            edits = hashlib.sha256(diff.encode()).hexdigest()[:12]
            return git("rev-parse", "HEAD").strip() + (f"+dirty-{edits}" if diff else "")
        except (OSError, subprocess.SubprocessError):
            pass  # no git here: the package's version says what it can
    try:
        return f"nightdesk {importlib.metadata.version('nightdesk')}"
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
