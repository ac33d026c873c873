"""Every `nightdesk ...` command that nightdesk's own words name exists as written: its
subcommands and its --options are the typer CLI's; every NIGHTDESK_ name is a setting; every
file of the repository and every make target they name is there on a host installed from the
wheel, or the words say it is the repository's.

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
from app.db.batchsettings import BatchSettings
from serving.preflight import PREPARE_MODEL, SETUP_SCRIPT
from tests.unit.support.wheel import shipped

ROOT = Path(__file__).resolve().parents[3]
# A command in a sentence: backticked (`nightdesk run --resume 5`), in parentheses or in
# <code>.
QUOTED = re.compile(r"`(nightdesk [^`]+)`|\((nightdesk [^)]+)\)|<code>(nightdesk [^<]+)</code>")
# An f-string's field, as a value the command is given (a batch id, a date).
FIELD = "VALUE"
# A file of the repository (`serving/prepare_model.py`, `docs/settings.md`), a shell script.
REPO_FILE = re.compile(r"\b(?:app|agents|serving|migrations|docs|deploy|tests|scripts)/"
                       r"[\w./-]*\w|\b[\w-]+\.sh\b")
# Words that say a file or target is the repository's, not the installed program's.
CHECKOUT = re.compile(r"\bcheckout\b|\brepository\b")


def _texts(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Yield every string's line and text: an f-string whole, not its parts; no docstring
    (an attribute's, a string standing alone as a statement, included), no pattern (a
    ``re.compile`` argument: it matches commands, names none)."""
    skipped = {id(node.value) for node in ast.walk(tree)
               if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
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


def _strings() -> Iterator[tuple[str, str]]:
    """Yield (where, text) for every string of app/, agents/ and serving/ (as ``_texts``
    reads them) and every page template."""
    for package in ("app", "agents", "serving"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, text in _texts(ast.parse(path.read_text())):
                yield f"{path.relative_to(ROOT)}:{line}", text
    for path in sorted((ROOT / "app/web/templates").glob("*.html")):
        yield str(path.relative_to(ROOT)), re.sub(r"{{.*?}}", FIELD, path.read_text())


def not_installed(text: str, files: set[str], targets: set[str]) -> list[str]:
    """Return the repository files and make targets ``text`` names that an installed host
    lacks, unless ``text`` says they are the repository's. A path from the repository's
    top (``serving/prepare_model.py``) is there only in a checkout, shipped or not; a bare
    name (``Path(__file__).with_name("setup-cpu-env.sh")``, a path made where it is
    installed) must be a shipped file's."""
    if CHECKOUT.search(text):
        return []
    names = {name.rsplit("/", 1)[-1] for name in files}
    named = [name for name in REPO_FILE.findall(text) if "/" in name or name not in names]
    return named + [f"make {target}" for target in re.findall(r"\bmake ([\w-]+)", text)
                    if target in targets]


MAKE_TARGETS = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))


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
        return ResumePoint(7, kind, day, None, BatchSettings.read(recorded), planned[:1], 0,
                           "crashed", planned=tuple(planned),
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


def test_every_file_and_make_target_nightdesk_names_is_there_where_it_is_installed() -> None:
    # A host installed from the wheel has no checkout: no docs/, no Makefile, no script
    # that is not package data. Advice names what ships, or says it is the repository's.
    files = shipped(ROOT)
    named = [(where, text) for where, text in _strings() if REPO_FILE.search(text)
             or re.search(r"\bmake ", text)]
    assert len(named) > 5
    assert [(where, missing) for where, text in named
            if (missing := not_installed(text, files, MAKE_TARGETS))] == []
    # The set-up steps the preflight names by their installed place ship too.
    assert {str(path.relative_to(ROOT)) for path in (SETUP_SCRIPT, PREPARE_MODEL)} <= files


def test_a_checkout_only_file_or_target_in_advice_is_caught() -> None:
    files = shipped(ROOT)
    assert {"serving/prepare_model.py", "serving/profiles/cpu-tiny.toml",
            "app/web/templates/track.html", "migrations/script.py.mako"} <= files
    assert "docs/settings.md" not in files and "Makefile" not in files
    assert not_installed("run serving/fix-env.sh first", files, MAKE_TARGETS) == [
        "serving/fix-env.sh"]
    assert not_installed("run fix-env.sh first", files, MAKE_TARGETS) == ["fix-env.sh"]
    assert not_installed("run VALUE bash setup-cpu-env.sh", files, MAKE_TARGETS) == []
    assert not_installed("run python serving/prepare_model.py", files, MAKE_TARGETS) == [
        "serving/prepare_model.py"]
    assert not_installed("see docs/operations.md", files, MAKE_TARGETS) == [
        "docs/operations.md"]
    assert not_installed("build it with make vllm-env", files, MAKE_TARGETS) == [
        "make vllm-env"]
    assert not_installed("from a checkout of the repository: make vllm-env", files,
                         MAKE_TARGETS) == []
    assert not_installed("make the database writable", files, MAKE_TARGETS) == []
