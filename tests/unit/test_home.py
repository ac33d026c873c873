"""Where settings put nightdesk's files: the data home and the paths derived from it."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from app.config import load_settings

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = '[project]\nname = "{name}"\nversion = "0"\n'


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder with no NIGHTDESK_HOME and a private HOME/XDG_DATA_HOME."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("NIGHTDESK_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return folder


def test_a_checkout_keeps_everything_under_var(cwd: Path) -> None:
    (cwd / "pyproject.toml").write_text(PYPROJECT.format(name="nightdesk"))
    s = load_settings()
    assert s.paths.home == Path("var")
    assert s.store.database_url == "sqlite:///var/nightdesk.db"
    assert (s.paths.data_dir, s.paths.models_dir, s.paths.server_dir) == (
        Path("var/data"), Path("var/models"), Path("var/server"))
    assert s.paths.vllm_venv == Path(".venv-vllm")


def test_another_projects_folder_is_not_a_checkout(cwd: Path, tmp_path: Path) -> None:
    (cwd / "pyproject.toml").write_text(PYPROJECT.format(name="someone-else"))
    home = tmp_path / "user" / ".local" / "share" / "nightdesk"
    s = load_settings()
    assert s.paths.home == home
    assert s.store.database_url == f"sqlite:///{tmp_path}/user/.local/share/nightdesk/nightdesk.db"
    assert s.paths.server_dir == home / "server"
    assert s.paths.vllm_venv == home / "venv-vllm"


def test_installed_home_follows_xdg_data_home(cwd: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    s = load_settings()
    assert s.paths.home == tmp_path / "xdg" / "nightdesk"
    assert s.paths.data_dir == tmp_path / "xdg" / "nightdesk" / "data"


def test_nightdesk_home_moves_every_path(cwd: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (cwd / "pyproject.toml").write_text(PYPROJECT.format(name="nightdesk"))
    monkeypatch.setenv("NIGHTDESK_HOME", str(tmp_path / "nd"))
    s = load_settings()
    assert s.store.database_url == f"sqlite:///{tmp_path}/nd/nightdesk.db"
    assert s.paths.data_dir == tmp_path / "nd" / "data"
    assert s.paths.models_dir == tmp_path / "nd" / "models"
    assert s.paths.server_dir == tmp_path / "nd" / "server"
    # In a checkout the CPU server's environment is where make builds it, whatever the home.
    assert s.paths.vllm_venv == Path(".venv-vllm")


def test_an_explicit_path_beats_the_home(cwd: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTDESK_HOME", str(tmp_path / "nd"))
    monkeypatch.setenv("NIGHTDESK_DATA_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("NIGHTDESK_DATABASE_URL", "postgresql://u@h/db")
    s = load_settings()
    assert s.paths.data_dir == tmp_path / "elsewhere"
    assert s.store.database_url == "postgresql+psycopg://u@h/db"
    assert s.paths.server_dir == tmp_path / "nd" / "server"


def test_home_from_the_settings_file_and_a_tilde(cwd: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "n.toml"
    config.write_text('home = "~/nd"\n')
    monkeypatch.setenv("NIGHTDESK_CONFIG", str(config))
    s = load_settings()
    assert s.paths.home == tmp_path / "user" / "nd"
    assert s.paths.server_dir == tmp_path / "user" / "nd" / "server"


def test_make_refuses_a_home_with_a_space_in_one_line(tmp_path: Path) -> None:
    # make splits a path at its spaces: `make run` would prepare the model into two folders
    # and hand the night half a universe path. Refused before any recipe runs (`-n`: none).
    home = tmp_path / "my home"
    done = subprocess.run(["make", "-n", "run"], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NIGHTDESK_HOME": str(home)})
    assert done.returncode != 0, done.stdout
    [line] = done.stderr.strip().splitlines()
    assert line.endswith(f"*** NIGHTDESK_HOME has a space ({home}): make cannot name the files "
                         "under it; give one without spaces (nightdesk itself takes it).  Stop.")


def _make_n(target: str, env: dict[str, str]) -> list[str]:
    """Return the shell commands ``make -n target`` prints, continuation lines joined and
    split at each ``;``."""
    done = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return [part.strip() for part in done.stdout.replace("\\\n", " ").replace("\n", ";")
            .split(";") if part.strip()]


def test_make_run_and_model_follow_the_path_settings(cwd: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # `make run` writes the demo with `nightdesk data demo` (into the settings' data folder)
    # and prepares the model where the settings look for it: the night it starts must take
    # the tickers the settings say, the model the server will look for.
    from agents.data.demo import DEMO_AS_OF, write_demo
    from app.runs.nightly import nightly_tickers

    env = {"NIGHTDESK_DATA_DIR": str(tmp_path / "snapshots"),
           "NIGHTDESK_MODELS_DIR": str(tmp_path / "models"),
           "NIGHTDESK_VLLM_VENV": str(tmp_path / "vllm")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    write_demo(tmp_path / "snapshots", DEMO_AS_OF, 2)
    settings = load_settings()

    def night(commands: list[str]) -> list[str]:
        [line] = [c for c in commands if c.startswith(".venv/bin/nightdesk run ")]
        words = shlex.split(line.split("||")[0])
        given = {word: words[i + 1] for i, word in enumerate(words) if word.startswith("--")}
        assert given["--as-of"] == str(DEMO_AS_OF), line
        universe = given.get("--universe")
        return nightly_tickers(settings, DEMO_AS_OF, given.get("--tickers"),
                               None if universe is None else REPO / universe)[0]

    assert night(_make_n("run", env)) == ["ALPH.DEMO", "BRAV.DEMO"]
    (tmp_path / "mine.txt").write_text("ZULU.DEMO\n")
    monkeypatch.setenv("NIGHTDESK_UNIVERSE_FILE", str(tmp_path / "mine.txt"))
    settings = load_settings()
    assert night(_make_n("run", {**env, "NIGHTDESK_UNIVERSE_FILE": str(tmp_path / "mine.txt")})
                 ) == ["ZULU.DEMO"]

    [prepare] = [c for c in _make_n("model", env) if "prepare_model.py" in c]
    assert prepare.split() == [f"{settings.paths.vllm_venv}/bin/python",
                               "serving/prepare_model.py", "--out",
                               str(settings.paths.models_dir / "smollm2-135m")]
