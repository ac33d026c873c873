"""Check that docs/architecture.md's "Where things are" map names every module in the tree,
and no other.

The rule, so the map keeps one line per module without listing every data file:

- a Python module of the code packages (``app/``, ``agents/``, ``serving/``) is named by its
  own path; a package's ``__init__.py`` by its folder (``app/batch/``);
- any other file under the mapped folders is named by its own path or by its folder
  (``agents/prompts/`` covers the prompt files, ``docs/bench/`` the raw JSON);
- every path the map names exists (a folder: holds at least one file), and none twice.

The tree is what git tracks plus new files it does not ignore, so a module is caught before
it is committed.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAPPED = ("app", "agents", "serving", "migrations", "deploy", "tests", "docs")
CODE_PACKAGES = ("app", "agents", "serving")
HEADING = "## Where things are"
ENTRY = re.compile(r"^\s*- `([^`]+)`", re.MULTILINE)


def map_entries(doc: str) -> list[str]:
    """Return the paths the map's list items open with, in order."""
    start = doc.find(HEADING + "\n")
    assert start >= 0, f"docs/architecture.md has no {HEADING!r} section"
    end = doc.find("\n## ", start + len(HEADING))
    section = doc[start : end if end >= 0 else len(doc)]
    return ENTRY.findall(section)


def map_problems(entries: list[str], files: list[str]) -> dict[str, str]:
    """Return {path: what is wrong} for every disagreement between the map and the files."""
    named = set(entries)
    folders = {f"{p}/" for f in files for p in PurePosixPath(f).parents if str(p) != "."}
    problems: dict[str, str] = {}
    for entry in entries:
        if entries.count(entry) > 1:
            problems[entry] = "named more than once"
        elif entry not in (folders if entry.endswith("/") else files):
            problems[entry] = "named in the map but not in the tree"
    for file in files:
        path = PurePosixPath(file)
        parent = str(path.parent) + "/"
        if path.name == "__init__.py":
            if parent not in named:
                problems[file] = f"its package {parent} is missing from the map"
        elif path.suffix == ".py" and path.parts[0] in CODE_PACKAGES:
            if file not in named:
                problems[file] = "module missing from the map"
        elif file not in named and parent not in named:
            problems[file] = f"neither it nor {parent} is in the map"
    return problems


def tree_files() -> list[str]:
    """Return the files under the mapped folders: tracked, or new and not ignored by git."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *MAPPED],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    # A tracked file deleted in the working tree is gone from the tree the map describes.
    return sorted(f for f in set(out.splitlines()) if (ROOT / f).is_file())


@pytest.fixture(scope="module")
def doc() -> str:
    return (ROOT / "docs" / "architecture.md").read_text()


@pytest.fixture(scope="module")
def files() -> list[str]:
    return tree_files()


def test_map_matches_tree(doc: str, files: list[str]) -> None:
    problems = map_problems(map_entries(doc), files)
    assert problems == {}, "docs/architecture.md's map and the tree disagree:\n" + "\n".join(
        f"  {path}: {why}" for path, why in sorted(problems.items()))


def test_tree_has_the_modules_the_rule_is_about(files: list[str]) -> None:
    # Guards the test above against an empty or wrong file list (it would then pass on nothing).
    assert "app/config.py" in files
    assert "agents/graph.py" in files
    assert "serving/launcher.py" in files
    assert any(f.startswith("agents/prompts/") and f.endswith(".j2") for f in files)


def _add_line(text: str, entry: str) -> str:
    return text.replace("- `app/config.py`", f"- `{entry}` — added\n  - `app/config.py`", 1)


def _drop_line(text: str, entry: str) -> str:
    lines = text.splitlines(keepends=True)
    kept = [ln for ln in lines if not ln.lstrip().startswith(f"- `{entry}`")]
    assert len(kept) == len(lines) - 1, f"the map has no line for {entry}"
    return "".join(kept)


@pytest.mark.parametrize(
    ("edit", "entry", "expected"),
    [
        pytest.param(_add_line, "app/ghost.py", {"app/ghost.py"}, id="names a missing module"),
        pytest.param(_add_line, "agents/phantom/", {"agents/phantom/"}, id="names no folder"),
        pytest.param(_add_line, "app/home.py", {"app/home.py"}, id="names a module twice"),
        pytest.param(_drop_line, "app/home.py", {"app/home.py"}, id="leaves out a module"),
        pytest.param(_drop_line, "app/batch/", {"app/batch/__init__.py"}, id="drops a package"),
        # Every prompt file, found in the tree below: a data folder covers its files.
        pytest.param(_drop_line, "agents/prompts/", None, id="leaves out a data folder"),
    ],
)
def test_a_wrong_map_fails(
    doc: str, files: list[str], edit: Callable[[str, str], str], entry: str,
    expected: set[str] | None,
) -> None:
    if expected is None:
        expected = {f for f in files if f.startswith(entry)}
    assert expected, "the case must expect at least one problem"
    assert set(map_problems(map_entries(edit(doc, entry)), files)) == expected


def test_rule_on_a_small_tree() -> None:
    files = ["app/__init__.py", "app/a.py", "app/sub/__init__.py", "app/sub/b.py",
             "app/sub/c.j2", "docs/x.md", "docs/bench/r.json"]
    full = ["app/", "app/a.py", "app/sub/", "app/sub/b.py", "docs/x.md", "docs/bench/"]
    assert map_problems(full, files) == {}
    # A code module is not covered by its folder; a data file is.
    assert set(map_problems([e for e in full if e != "app/sub/b.py"], files)) == {"app/sub/b.py"}
    assert set(map_problems([e for e in full if e != "app/sub/"], files)) == {
        "app/sub/__init__.py", "app/sub/c.j2"}
    # A folder names only its own files: docs/ does not cover docs/bench/r.json.
    assert set(map_problems(["docs/" if e == "docs/bench/" else e for e in full], files)) == {
        "docs/bench/r.json"}
