"""Check the import contracts in pyproject.toml: they hold here and break on one wrong import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "agents", "serving")
# The console script beside this interpreter: the one `make lint` runs.
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
LAYERS = "app (the service) may import agents and serving; they never import app"
INDEPENDENCE = "agents (the pipeline) and serving (the vLLM server) do not import each other"
APP_LAYERS = "app's modules import downwards only"
APP_ACYCLIC = "app's modules import each other in no circle"
MORNING = "app.morning is layered bottom-up (app/morning/__init__.py)"
RUNS = "app.runs is layered bottom-up (app/runs/__init__.py)"
RECORDER = "app.recorder is layered bottom-up (app/recorder/__init__.py)"
WEB_RENDERS = "app.web reads no row itself: it imports no table (app.db.models)"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Run lint-imports on the packages under ``root``, with ``root``'s pyproject.toml."""
    # lint-imports puts its working directory first on sys.path, so a scratch copy's packages
    # shadow the installed (editable) ones; PYTHONPATH says the same for any child import.
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def scratch_copy(tmp_path: Path) -> Path:
    """Copy the three packages and pyproject.toml (the contract) into a fresh folder."""
    root = tmp_path / "tree"
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_contract_holds_on_this_tree() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{LAYERS} KEPT" in result.stdout
    assert f"{INDEPENDENCE} KEPT" in result.stdout
    assert f"{APP_LAYERS} KEPT" in result.stdout
    assert f"{APP_ACYCLIC} KEPT" in result.stdout
    assert f"{MORNING} KEPT" in result.stdout
    assert f"{RUNS} KEPT" in result.stdout
    assert f"{WEB_RENDERS} KEPT" in result.stdout


def test_contract_holds_on_an_unchanged_copy(tmp_path: Path) -> None:
    # The control for the cases below: the copy alone breaks nothing.
    result = lint_imports(scratch_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "line", "broken", "named"),
    [
        ("agents/wrong.py", "from app.config import Settings\n", LAYERS,
         "agents.wrong -> app.config"),
        ("serving/wrong.py", "import app.errors\n", LAYERS, "serving.wrong -> app.errors"),
        ("agents/wrong.py", "from serving.urls import server_root\n", INDEPENDENCE,
         "agents.wrong -> serving.urls"),
        # Inside app/: a low layer reaching up, and a module no layer names.
        ("app/db/wrong.py", "from app.batch.store import now\n", APP_LAYERS,
         "app.db.wrong -> app.batch.store"),
        ("app/wrong.py", "import app.errors\n", APP_LAYERS, "app.wrong"),
        # The engine reaching up into the orchestration that runs it.
        ("app/batch/wrong.py", "import app.runs.preflight\n", APP_LAYERS,
         "app.batch.wrong -> app.runs.preflight"),
        # The engine reaching up into the recorder attached to it.
        ("app/batch/wrong.py", "from app.recorder.figures import admission\n", APP_LAYERS,
         "app.batch.wrong -> app.recorder.figures"),
        # A page reading rows itself instead of through the read side's views.
        ("app/web/wrong.py", "from app.db.models import Batch\n", WEB_RENDERS,
         "app.web.wrong -> app.db.models"),
    ],
)
def test_one_wrong_import_breaks_the_contract(tmp_path: Path, module: str, line: str,
                                               broken: str, named: str) -> None:
    root = scratch_copy(tmp_path)
    # A module that exists only in the copy, so a report naming it proves the copy was read.
    (root / module).write_text(f'"""Import across the layers on purpose."""\n\n{line}')

    result = lint_imports(root)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{broken} BROKEN" in result.stdout
    assert named in result.stdout


def test_a_circle_inside_one_package_breaks_the_acyclic_contract(tmp_path: Path) -> None:
    # Two modules of one layer (app.web) importing each other: only the circle rule sees it.
    root = scratch_copy(tmp_path)
    for name, other in (("wrong_a", "wrong_b"), ("wrong_b", "wrong_a")):
        (root / f"app/web/{name}.py").write_text(f'"""Half."""\n\nimport app.web.{other}\n')

    result = lint_imports(root)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{APP_ACYCLIC} BROKEN" in result.stdout
    assert f"{APP_LAYERS} KEPT" in result.stdout
    assert "wrong_a" in result.stdout and "wrong_b" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken", "named"),
    [
        # Inside the read side: a bottom module reaching up to one that reads more.
        ("app/morning/timeline.py", "import app.morning.changes\n", MORNING,
         "app.morning.timeline -> app.morning.changes"),
        # Two modules of one layer of the orchestration, which must not import each other.
        ("app/runs/replay.py", "import app.runs.nightly\n", RUNS,
         "app.runs.replay -> app.runs.nightly"),
        # The live progress reaching across to the summaries, beside it in one layer.
        ("app/recorder/progress.py", "import app.recorder.figures\n", RECORDER,
         "app.recorder.progress -> app.recorder.figures"),
    ],
)
def test_an_upward_import_inside_a_package_breaks_its_contract(
        tmp_path: Path, module: str, line: str, broken: str, named: str) -> None:
    root = scratch_copy(tmp_path)
    # Appended to a module that exists, so the contract is broken by the import alone, not
    # by a module its `exhaustive` list lacks.
    with (root / module).open("a") as f:
        f.write(line)

    result = lint_imports(root)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{broken} BROKEN" in result.stdout
    assert named in result.stdout
    assert f"{APP_ACYCLIC} KEPT" in result.stdout
