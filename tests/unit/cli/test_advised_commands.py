"""Every `nightdesk ...` command that nightdesk's own words name exists as written: its
subcommands and its --options are the typer CLI's; every NIGHTDESK_ name is a setting.

Read from the source, not from a run, so advice no test reaches is checked too: every
string of app/, agents/ and serving/ (an f-string's fields read as values) that is a
command or holds one in backticks, and every <code> of the page templates. Docstrings are
prose about the commands and are left out.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperGroup

from app.cli import app
from app.config import CONFIG_ENV, FLAT, OTHER_ENV, TEST_ENV_PREFIX

ROOT = Path(__file__).resolve().parents[3]
# A command in a sentence: backticked (`nightdesk run --resume 5`), in parentheses or in
# <code>.
QUOTED = re.compile(r"`(nightdesk [^`]+)`|\((nightdesk [^)]+)\)|<code>(nightdesk [^<]+)</code>")
# An f-string's field, as a value the command is given (a batch id, a date).
FIELD = "VALUE"


def _texts(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Yield every string's line and text: an f-string whole, not its parts; no docstring,
    no pattern (a ``re.compile`` argument: it matches commands, names none)."""
    skipped = {id(node.body[0].value) for node in ast.walk(tree)
               if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                             | ast.AsyncFunctionDef)
               and node.body and isinstance(node.body[0], ast.Expr)
               and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skipped |= {id(part) for part in node.values}
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "compile"):
            skipped |= {id(arg) for arg in ast.walk(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(
                str(part.value) if isinstance(part, ast.Constant) else FIELD
                for part in node.values)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in skipped):
            yield node.lineno, node.value


def advised() -> list[tuple[str, str]]:
    """Return (where, command) for every command nightdesk's strings and pages name."""
    found: list[tuple[str, str]] = []
    for package in ("app", "agents", "serving"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, text in _texts(ast.parse(path.read_text())):
                where = f"{path.relative_to(ROOT)}:{line}"
                # A string that is a command (not the version string "nightdesk 1.2").
                if text.startswith("nightdesk ") and "`" not in text \
                        and not text.startswith(f"nightdesk {FIELD}"):
                    found.append((where, text))
                found += [(where, "".join(match)) for match in QUOTED.findall(text)]
    for path in sorted((ROOT / "app/web/templates").glob("*.html")):
        for match in QUOTED.findall(re.sub(r"{{.*?}}", FIELD, path.read_text())):
            found.append((str(path.relative_to(ROOT)), "".join(match)))
    return sorted(set(found))


def unknown_words(command: str) -> list[str]:
    """Return what of ``command`` the CLI does not have: a subcommand, or an option of the
    command it reaches (positional values are not judged)."""
    words = command.split()[1:]
    node: Any = typer.main.get_command(app)
    while isinstance(node, TyperGroup) and words and not words[0].startswith("-"):
        names = words.pop(0).split("|")  # "quality repro|samples": each of them
        missing = [name for name in names if name not in node.commands]
        if missing:
            return missing
        node = node.commands[names[0]]
        if len(names) > 1:
            return [w for name in names[1:] for w in
                    unknown_words(" ".join(["nightdesk", name, *words]))]
    options = {opt for param in node.params for opt in param.opts + param.secondary_opts}
    return [word for word in (w.strip("[]").split("=")[0] for w in words)
            if word.startswith("--") and word not in options | {"--help"}]


ADVISED = advised()


def test_the_scan_finds_the_advice_it_is_meant_to_check() -> None:
    # The scan itself: the digest's resume, the refused night's start again, a page's.
    commands = {command for _, command in ADVISED}
    assert {f"nightdesk run --resume {FIELD}", "nightdesk run --continue-night",
            f"nightdesk report --compare {FIELD}"} <= commands, sorted(commands)
    assert len(ADVISED) > 30


@pytest.mark.parametrize(("where", "command"), ADVISED)
def test_every_command_nightdesk_names_exists(where: str, command: str) -> None:
    assert unknown_words(command) == [], f"{where}: {command}"


def test_a_command_or_option_that_does_not_exist_is_caught() -> None:
    assert unknown_words("nightdesk run --resume 5 --retry-failed") == []
    assert unknown_words("nightdesk run --resume 5 --retry") == ["--retry"]
    assert unknown_words("nightdesk rerun AAPL --as-of VALUE --samples 3") == []
    assert unknown_words("nightdesk reports 5") == ["reports"]
    assert unknown_words("nightdesk quality repro|sample") == ["sample"]
    assert unknown_words("nightdesk server start --profile cpu-tiny --gpu 0") == ["--gpu"]


def test_every_setting_nightdesk_names_exists() -> None:
    # The names read beside the settings (the vLLM unit's, docs/bench's) are names too; the
    # tests' prefix is no name.
    settings = {f"NIGHTDESK_{name.upper()}" for name in FLAT} | {CONFIG_ENV, *OTHER_ENV,
                                                                 TEST_ENV_PREFIX}
    named: list[tuple[str, str]] = []
    for package in ("app", "agents", "serving"):
        for path in sorted((ROOT / package).rglob("*.py")):
            named += [(f"{path.relative_to(ROOT)}:{line}", name)
                      for line, text in _texts(ast.parse(path.read_text()))
                      for name in re.findall(r"NIGHTDESK_[A-Z0-9_]+", text)
                      if FIELD not in name]  # NIGHTDESK_{name}: a setting's name made
    for path in sorted((ROOT / "app/web/templates").glob("*.html")):
        named += [(str(path), name) for name in re.findall(r"NIGHTDESK_[A-Z0-9_]+",
                                                             path.read_text())]
    assert len(named) > 20
    assert [(where, name) for where, name in named if name not in settings] == []


def test_the_commands_made_from_a_batchs_state_have_only_options_the_cli_has() -> None:
    # Their options come in f-string fields, which the scan reads as values: each form.
    from datetime import date
    from pathlib import Path as FilePath

    from app.config import load_settings
    from app.runs.nightly import NightlyRequest
    from app.runs.resumable import ResumePoint

    settings = load_settings()
    day = date(2026, 11, 27)

    def point(kind: str, planned: list[str], universe: list[str] | None,
              recorded: dict[str, Any]) -> ResumePoint:
        return ResumePoint(7, kind, day, None, recorded, planned[:1], 0, "crashed",
                           planned=tuple(planned),
                           universe=None if universe is None else tuple(universe))

    made = [point("nightly", ["A", "B"], ["A", "B", "C"], {"samples": 3}).anew(settings),
            point("nightly", ["C", "A"], ["A", "B", "C"],
                  {"strategy": "fixed-4:tail=on"}).anew(settings),
            point("nightly", ["A", "B", "C"], ["A", "B", "C"], {}).anew(settings),
            point("nightly", ["A"], None, {"samples": 2}).anew(settings),
            point("rerun", ["A"], None, {"samples": 2}).anew(settings),
            "nightdesk run --as-of 2026-11-27" + NightlyRequest(
                tickers="A,B", universe=FilePath("u.txt"), limit=2, samples=2,
                strategy="fixed-4").options()]
    assert made[:2] == ["nightdesk run --as-of 2026-11-27 --limit 2 --samples 3",
                        "nightdesk run --as-of 2026-11-27 --tickers C,A --strategy "
                        "fixed-4:tail=on"], made
    assert [(command, unknown_words(command)) for command in made] == \
        [(command, []) for command in made]
