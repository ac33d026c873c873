"""Every option that names where a command writes (`--out`, `--json-out`), given a place
nothing can be written: one line naming the option and the reason, exit 2, before anything
is written, and nothing the check made left behind. Read from the command tree, so an
option added later is covered too. Before, `data demo --out /proc/x` (and `data freeze`'s)
ended in a traceback from pathlib (`FileNotFoundError: [Errno 2] …`).

Also `bench durability --pg-url`: anything but a PostgreSQL URL is one line and exit 2;
before, `notaurl` was a traceback from SQLAlchemy and "" ran the bench on SQLite.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from agents.data.demo import DEMO_AS_OF, demo_tickers
from app.cli import app
from tests.unit.support.clirun import run_cli

DEAD_SERVER = {"NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1"}  # never one in use
# What each such command needs besides the path to reach its check (files it reads are
# read after it). A command missing here fails test_every_output_option_is_known.
NEEDS: dict[str, list[str]] = {
    "data demo": ["--tickers", "2"],
    "data freeze": ["--provider", "snapshot", "--as-of", DEMO_AS_OF.isoformat(),
                    "--tickers", demo_tickers(1)[0]],
    "bench schedulers": ["--strategies", "fixed-3"],
    "bench combine": ["nonesuch.json"],
    "bench durability": ["--runs", "1"],
}


def output_options() -> Iterator[tuple[str, str]]:
    """Yield (command path, option) for every option that names a place to write."""
    def walk(command: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])
        for param in getattr(command, "params", []):
            yield " ".join(path), param

    for path, param in walk(typer.main.get_command(app), []):
        if param.param_type_name == "option" and param.opts[0] in ("--out", "--json-out"):
            yield path, param.opts[0]


OPTIONS = list(output_options())


def test_every_output_option_is_known() -> None:
    assert {path for path, _ in OPTIONS} == set(NEEDS)


def _unwritable(tmp_path: Path, where: str) -> Path:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return {"under /proc": Path("/proc/nightdesk/out"),  # no one may make a folder there
            "a file": a_file, "under a file": a_file / "out"}[where]


# Each option, and each place nothing can be written to: a file is one for `--out` (a
# folder), not for `--json-out`, which writes one (left out, not skipped: it never applies).
UNWRITABLE = [(command, option, where) for command, option in OPTIONS
              for where in ("under /proc", "a file", "under a file")
              if not (option == "--json-out" and where == "a file")]


@pytest.mark.parametrize(("command", "option", "where"), UNWRITABLE,
                         ids=[f"{where}-{command} {option}" for command, option, where
                              in UNWRITABLE])
def test_an_output_nothing_can_be_written_to_is_one_line_before_anything_is_written(
        tmp_path: Path, demo_dir: Path, command: str, option: str, where: str) -> None:
    # demo_dir: the home's snapshot, which `data freeze --provider snapshot` reads
    target = _unwritable(tmp_path, where)
    before = sorted(tmp_path.rglob("*"))
    done = run_cli(*command.split(), *NEEDS[command], option, str(target), env=DEAD_SERVER)
    assert done.code == 2, (done.stdout, done.stderr)
    assert done.error_lines == [done.error_lines[0]], done.stderr
    assert done.error_lines[0].startswith(f"error: {option} {target}: cannot write there ("), \
        done.stderr
    assert "Errno" not in done.stderr
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, nothing the check made


def test_a_new_output_folder_is_written_where_asked(tmp_path: Path) -> None:
    target = tmp_path / "new" / "deep"
    done = run_cli("data", "demo", "--tickers", "2", "--out", str(target))
    assert done.code == 0, done.stderr
    assert (target / DEMO_AS_OF.isoformat() / "universe.txt").is_file()


@pytest.mark.parametrize("url", ["", "notaurl", "http://host/x", "sqlite:////tmp/x.db",
                                 "postgresql+nonesuch://u@h/x"])
def test_bench_durability_takes_only_a_postgresql_url(url: str) -> None:
    done = run_cli("bench", "durability", "--runs", "1", "--pg-url", url, env=DEAD_SERVER)
    assert done.code == 2, (done.stdout, done.stderr)
    assert done.error_lines == [f"error: --pg-url takes a PostgreSQL URL, like postgresql://"
                                f"user:<password>@host:5432/nightdesk (got {url!r})"]
    assert done.stdout == ""
