"""Each bad setting or database given to ``nightdesk``: exit 2 and one line, no traceback.

Every line names what to fix: the setting's variable, or the database and what the driver
said, never a URL's password. A few cases also run as the real process, as a timer runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.support.clirun import run_cli
from tests.webhook import closed_port

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pw-7c1d"  # in database URLs below: it must not be printed


def not_a_database(home: Path) -> str:
    path = home / "junk.db"
    path.write_bytes(b"this is a text file, not SQLite " * 64)
    return f"sqlite:///{path}"


def junk_checkpoints(home: Path) -> str:
    (home / "night.checkpoints.db").write_bytes(b"not SQLite either " * 64)
    return f"sqlite:///{home / 'night.db'}"


def bad_toml(home: Path) -> str:
    path = home / "settings.toml"
    path.write_text("log_level = \n")
    return str(path)


def a_file(home: Path) -> str:
    path = home / "plain-file"
    path.write_text("x")
    return str(path)


# (setting, value or a function of the home folder, command, what the one line must say)
CASES = [
    ("NIGHTDESK_LOG_LEVEL", "BOGUS", "ranking", "NIGHTDESK_LOG_LEVEL"),
    ("NIGHTDESK_LOG_FORMAT", "xml", "db upgrade", "NIGHTDESK_LOG_FORMAT"),
    ("NIGHTDESK_NODE_MAX_TOKENS", "{", "run --tickers AAPL", "NIGHTDESK_NODE_MAX_TOKENS"),
    ("NIGHTDESK_NODE_MAX_TOKENS", '{"trader": "many"}', "report",
     "NIGHTDESK_NODE_MAX_TOKENS (at trader)"),
    ("NIGHTDESK_NODE_MAX_TOKENS", "[1, 2]", "preflight", "NIGHTDESK_NODE_MAX_TOKENS"),
    ("NIGHTDESK_HEARTBEAT_STALE_S", "1e999", "report", "NIGHTDESK_HEARTBEAT_STALE_S"),
    ("NIGHTDESK_TEMPERATURE", "nan", "run --tickers AAPL", "NIGHTDESK_TEMPERATURE"),
    ("NIGHTDESK_OUTAGE_BUDGET_S", "inf", "preflight", "NIGHTDESK_OUTAGE_BUDGET_S"),
    ("NIGHTDESK_CONFIG", bad_toml, "ranking", "invalid settings file"),
    ("NIGHTDESK_DATABASE_URL", "sqlite:////proc/nope/x.db", "run --tickers AAPL",
     "cannot open database sqlite:////proc/nope/x.db"),
    ("NIGHTDESK_DATABASE_URL", "sqlite:////proc/nope/x.db", "db upgrade", "/proc/nope"),
    ("NIGHTDESK_DATABASE_URL", not_a_database, "report", "file is not a database"),
    ("NIGHTDESK_DATABASE_URL", not_a_database, "run --tickers AAPL", "not a database"),
    ("NIGHTDESK_DATABASE_URL", not_a_database, "db upgrade", "not a database"),
    ("NIGHTDESK_DATABASE_URL", junk_checkpoints, "run --tickers AAPL",
     "cannot open the checkpoint file"),
    ("NIGHTDESK_DATABASE_URL", junk_checkpoints, "run --resume", "not a database"),
    ("NIGHTDESK_DATABASE_URL", "sqlite:////sys/nightdesk.db", "ranking",
     "unable to open database file"),
    ("NIGHTDESK_DATABASE_URL", f"sqlite://nd:{SECRET}@//tmp/x.db", "ranking",
     "NIGHTDESK_DATABASE_URL"),
    ("NIGHTDESK_DATABASE_URL", f"postgresql://nd:{SECRET}@127.0.0.1:{{port}}/nightdesk",
     "report", "cannot reach database postgresql://nd:***@127.0.0.1"),
    ("NIGHTDESK_DATABASE_URL", f"postgresql://nd:{SECRET}@no-such-host.invalid/nightdesk",
     "db upgrade", "cannot reach database"),
    ("NIGHTDESK_HOME", a_file, "ranking", "cannot open database"),
    ("NIGHTDESK_SAMPLE", "4", "ranking",
     "NIGHTDESK_SAMPLE: no such setting; did you mean NIGHTDESK_SAMPLES?"),
]


def given(value: object, home: Path) -> str:
    return value(home) if callable(value) else str(value).replace("{port}", str(closed_port()))


def assert_one_line(code: int, stdout: str, stderr: str, says: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, stderr
    assert "Traceback" not in stderr + stdout
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and says in lines[0], lines[0]
    assert SECRET not in stderr + stdout


@pytest.mark.parametrize(("setting", "value", "command", "says"), CASES,
                         ids=[f"{c[0]}-{c[2].split()[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_bad_setting_or_database_exits_2_with_one_line(
        tmp_path: Path, setting: str, value: object, command: str, says: str) -> None:
    result = run_cli(*command.split(), env={
        "NIGHTDESK_LLM_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1",
        setting: given(value, tmp_path)})
    assert_one_line(result.code, result.stdout, result.stderr, says)


# The same in the real process, for one case of each kind: nothing escapes main() or prints
# at exit (the cases above run main() in this process; a subprocess costs seconds each).
IN_A_PROCESS = [CASES[0], CASES[3], CASES[10], CASES[12]]


@pytest.mark.slow
@pytest.mark.parametrize(("setting", "value", "command", "says"), IN_A_PROCESS,
                         ids=[f"{c[0]}-{c[2].split()[0]}" for c in IN_A_PROCESS])
def test_the_nightdesk_process_exits_2_with_one_line(
        tmp_path: Path, setting: str, value: object, command: str, says: str) -> None:
    env = {key: item for key, item in os.environ.items() if not key.startswith("NIGHTDESK_")}
    env.update(NIGHTDESK_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT),
               NIGHTDESK_LLM_BASE_URL=f"http://127.0.0.1:{closed_port()}/v1")
    env[setting] = given(value, tmp_path)
    done = subprocess.run([sys.executable, "-m", "app.cli", *command.split()], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert_one_line(done.returncode, done.stdout, done.stderr, says)
