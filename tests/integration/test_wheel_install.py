"""Build the wheel, install it into a fresh venv outside the checkout, and run nightdesk there.

This is what a GPU host does: ``pip install nightdesk-*.whl``, then ``nightdesk db upgrade``.
The commands run with the working directory and the data home in tmp_path and without
PYTHONPATH, so only the installed wheel can answer; the test asserts that too.
Installing resolves the dependencies with pip as a user would (about a minute with pip's
cache warm), so it lives with the integration tests.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agents.data.demo import DEMO_AS_OF, write_demo
from app.db.models import Base

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# What `pip install .` reads; the build runs on a copy so it leaves nothing in the checkout.
WHEEL_INPUTS = ("pyproject.toml", "README.md", "app", "agents", "serving", "migrations")
INSTALL_TIMEOUT_S = 900


def _run(argv: list[str | Path], cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT_S, cwd=cwd, env=env)
    assert done.returncode == 0, f"{argv} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a fresh venv (outside the repository) with the built wheel installed."""
    root = tmp_path_factory.mktemp("wheel")
    assert not root.is_relative_to(REPO)
    source = root / "source"
    source.mkdir()
    for name in WHEEL_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", root / "dist", source])
    (wheel,) = (root / "dist").glob("nightdesk-*.whl")
    env_dir = root / "venv"
    # The venv's own pip is not needed: this interpreter's pip installs into it (--python).
    _run([sys.executable, "-m", "venv", "--without-pip", env_dir])
    _run([sys.executable, "-m", "pip", "--python", env_dir / "bin" / "python", "install", "-q",
          wheel])
    return env_dir


@pytest.fixture
def place(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Return a working directory outside the checkout and an environment for the venv."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("NIGHTDESK_") and key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["NIGHTDESK_HOME"] = str(tmp_path / "home")
    env["HOME"] = str(tmp_path / "user")  # never the developer's ~/.local/share
    return cwd, env


def _nightdesk(venv: Path, place: tuple[Path, dict[str, str]], *args: str) -> str:
    cwd, env = place
    return _run([venv / "bin" / "nightdesk", *args], cwd=cwd, env=env).stdout


def _command_argv(line: str) -> list[str]:
    """Split a printed server command, dropping its leading NAME=VALUE environment words."""
    words = shlex.split(line)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words.pop(0)
    return words


def _head_revision() -> str:
    """Find the newest migration from the checkout's scripts: the one nothing revises."""
    revisions: dict[str, str | None] = {}
    for script in (REPO / "migrations" / "versions").glob("[0-9]*.py"):
        names = {
            node.targets[0].id: ast.literal_eval(node.value)
            for node in ast.parse(script.read_text()).body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("revision", "down_revision")
        }
        revisions[names["revision"]] = names["down_revision"]
    (head,) = set(revisions) - set(revisions.values())
    return head


def test_the_installed_package_is_what_runs(venv: Path,
                                            place: tuple[Path, dict[str, str]]) -> None:
    cwd, env = place
    code = ("import agents, app, migrations, serving\n"
            "for m in (agents, app, migrations, serving): print(m.__file__)")
    files = _run([venv / "bin" / "python", "-c", code], cwd=cwd, env=env).stdout.split()
    assert len(files) == 4
    for path in map(Path, files):
        assert path.is_relative_to(venv), path
        assert not path.is_relative_to(REPO), path


def test_db_upgrade_creates_the_schema_in_the_home(venv: Path,
                                                   place: tuple[Path, dict[str, str]]) -> None:
    _nightdesk(venv, place, "db", "upgrade")
    database = Path(place[1]["NIGHTDESK_HOME"]) / "nightdesk.db"
    assert database.is_file()
    with sqlite3.connect(database) as conn:
        (revision,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master "
                                                 "WHERE type = 'table'")}
    assert revision == _head_revision()
    assert set(Base.metadata.tables) <= tables
    assert not (place[0] / "var").exists()  # nothing relative to the working directory


def test_data_demo_writes_the_snapshot_under_the_home(
        venv: Path, place: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    out = _nightdesk(venv, place, "data", "demo", "--tickers", "3")
    written = Path(place[1]["NIGHTDESK_HOME"]) / "data" / DEMO_AS_OF.isoformat()
    assert str(written) in out
    # The same generator from the checkout writes the same bytes.
    reference = write_demo(tmp_path / "reference", DEMO_AS_OF, 3)
    expected = {p.relative_to(reference): p.read_bytes()
                for p in reference.rglob("*") if p.is_file()}
    got = {p.relative_to(written): p.read_bytes() for p in written.rglob("*") if p.is_file()}
    assert len(expected) > 3
    assert got == expected


def test_server_command_renders_the_shipped_profile(venv: Path,
                                                    place: tuple[Path, dict[str, str]]) -> None:
    profile = tomllib.loads((REPO / "serving/profiles/qwen-dense-27b.toml").read_text())
    argv = _command_argv(_nightdesk(venv, place, "server", "command", "--profile",
                                    "qwen-dense-27b"))
    assert argv[:3] == [*profile["entrypoint"], profile["model"]]
    assert argv[argv.index("--max-model-len") + 1] == str(profile["max_model_len"])
    assert argv[argv.index("--max-num-seqs") + 1] == str(profile["max_num_seqs"])
    assert argv[argv.index("--kv-cache-dtype") + 1] == profile["args"]["kv-cache-dtype"]


def test_cpu_profile_finds_its_venv_and_model_in_the_home(
        venv: Path, place: tuple[Path, dict[str, str]]) -> None:
    home = Path(place[1]["NIGHTDESK_HOME"])
    argv = _command_argv(_nightdesk(venv, place, "server", "command", "--profile", "cpu-tiny"))
    assert argv[0] == str(home / "venv-vllm" / "bin" / "python")
    assert argv[argv.index("--model") + 1] == str(home / "models" / "smollm2-135m")
