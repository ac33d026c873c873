"""Drive ``nightdesk`` in this process the way the console script does: argv in, exit code out.

Unlike typer's CliRunner this goes through ``app.cli.main``, where nightdesk errors become one
line and an exit code, so a test sees exactly what an operator sees.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass
from unittest import mock

import pytest

from app.cli import main
from app.config import get_settings


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        """Return what stderr says besides notes (a removed duplicate ticker, say)."""
        return [line for line in self.stderr.splitlines()
                if line.strip() and not line.startswith("note: ")]


def run_cli(*argv: str, env: dict[str, str] | None = None,
            stdout: io.StringIO | None = None, stderr: io.StringIO | None = None) -> CliResult:
    """Run ``nightdesk ARGV`` with extra environment ``env``; return its code and output.
    ``stdout``, ``stderr``: the streams it writes to (a closed pipe's stand-in, say)."""
    out, err = stdout or io.StringIO(), stderr or io.StringIO()
    get_settings.cache_clear()
    code: int | str | None = 0
    with (mock.patch.dict(os.environ, env or {}), mock.patch.object(sys, "argv",
                                                                    ["nightdesk", *argv]),
          contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)):
        try:
            main()
        except SystemExit as exit_:
            code = exit_.code
        finally:
            get_settings.cache_clear()
    return CliResult(code if isinstance(code, int) else 1, out.getvalue(), err.getvalue())


def nightdesk(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
              *args: str) -> tuple[int, str, str]:
    """Run the real CLI entry point in-process; return exit code, stdout and stderr.

    ``run_cli``'s twin for a test that reads output through pytest's own ``capsys``.
    In-process because importing the whole CLI in a child costs seconds per run.
    """
    monkeypatch.setattr(sys, "argv", ["nightdesk", *args])
    capsys.readouterr()
    code = 0
    try:
        main()
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err
