"""Quiet, clean output: one line per error without library prefixes, one mask, each failure
once, nothing of nightdesk's own examples masked, no wrapping when not on a terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from app.notify import Message, send
from serving.urls import MASK, redact
from tests.unit.support.clirun import run_cli
from tests.webhook import closed_port, webhook

NIGHTDESK = Path(sys.executable).with_name("nightdesk")


@pytest.mark.parametrize(("setting", "value", "says"), [
    ("NIGHTDESK_SCHEDULE_CRON", "every night", "not a crontab line"),
    ("NIGHTDESK_SCHEDULE_TIMEZONE", "Mars/Olympus", "Mars/Olympus"),
    ("NIGHTDESK_NODE_MAX_TOKENS", "analyst=1024", "not JSON"),
    ("NIGHTDESK_NODE_MAX_TOKENS", '{"nobody": 5}', "unknown node group 'nobody'"),
    ("NIGHTDESK_LLM_BASE_URL", "ftp://127.0.0.1:8000/v1", "not an http(s) URL"),
    ("NIGHTDESK_DATABASE_URL", "mysql://h/x", "unsupported scheme"),
    ("NIGHTDESK_NOTIFY", "not-a-url", "not an Apprise URL"),
    ("NIGHTDESK_WEB_BASE_URL", "desk.example.org", "NIGHTDESK_WEB_BASE_URL"),
    ("NIGHTDESK_TEMPERATURE", "9", "must be at most 2"),
    ("NIGHTDESK_SAMPLES", "0", "must be at least 1"),
    ("NIGHTDESK_HEARTBEAT_STALE_S", "soon", "expected a number"),
])
def test_a_bad_setting_is_one_line_without_pydantics_prefix(setting: str, value: str,
                                                              says: str) -> None:
    result = run_cli("batches", env={setting: value})
    assert result.code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: invalid setting {setting}: "), line
    assert says in line, line
    # pydantic's wording for a validator's own error ("Value error, …") stays out.
    assert "Value error" not in line and "Assertion failed" not in line, line
    assert "Input should be" not in line and "unable to parse" not in line, line


@pytest.mark.parametrize(("setting", "value", "example"), [
    ("NIGHTDESK_NOTIFY", "not-a-url", "mailto://user:<password>@host"),
    ("NIGHTDESK_DATABASE_URL", "postgresql:///x?host=a,b&port=1,2,3",
     "postgresql://user:<password>@host:5432/nightdesk"),
])
def test_the_masking_leaves_the_messages_own_example_as_written(setting: str, value: str,
                                                                 example: str) -> None:
    result = run_cli("batches", env={setting: value})
    assert result.code == 2 and example in result.stderr, result.stderr


def test_a_placeholder_password_is_no_secret_and_a_real_one_is() -> None:
    assert redact("mailto://user:<password>@host") == "mailto://user:<password>@host"
    assert redact("mailto://user:hunter2@host") == f"mailto://user:{MASK}@host"


def test_a_failed_destination_is_shown_once_with_one_mask_and_only_its_own_query() -> None:
    dead = f"json://ops:s3cret@127.0.0.1:{closed_port()}/gone?method=PUT"
    with webhook() as hook:
        result = run_cli("notify", "test", env={"NIGHTDESK_NOTIFY": f"{hook.url()},{dead}"})
    assert result.code == 1
    assert len(hook.posts) == 1
    failed = [line for line in result.stderr.splitlines() if "127.0.0.1:" in line]
    # Once: the command's own line, not a log line beside it.
    assert len(failed) == 1, result.stderr
    port = dead.split(":")[3].split("/")[0]
    assert failed[0].startswith(f"  not delivered: json://ops:{MASK}@127.0.0.1:{port}/gone"
                                "?method=PUT: "), failed[0]
    assert "s3cret" not in result.stderr and "****" not in result.stderr
    assert "overflow=" not in result.stderr and "retry=" not in result.stderr


def test_the_digests_log_line_names_a_failed_destination_the_same_way() -> None:
    dead = f"json://ops:s3cret@127.0.0.1:{closed_port()}/gone"
    with structlog.testing.capture_logs() as logs:
        delivery = send(dead, Message("t", "b"), 10)
    [event] = [e for e in logs if e["event"] == "notification not delivered"]
    assert event["destination"] == dead.replace("s3cret", MASK)
    assert list(delivery.failed) == [event["destination"]]


def test_the_ranking_table_keeps_each_cell_whole_when_piped(tmp_path: Path) -> None:
    # A rich console not on a terminal used to fold tables into 80 columns (COLUMNS here),
    # so the journal read "Underweigh" / "t".
    from sqlalchemy import create_engine

    from app.db.engine import ready_engine
    from tests.unit.support.night_rows import Rated, add_night, at
    from tests.unit.support.web_rows import D1, D2

    url = f"sqlite:///{tmp_path}/nightdesk.db"
    ready_engine(url)
    engine = create_engine(url)
    names = [f"TICKER{i:02d}" for i in range(6)]
    add_night(engine, D1, at(D2, 0, 10), {name: Rated("Underweight", -0.3) for name in names})
    engine.dispose()
    result = subprocess.run([str(NIGHTDESK), "ranking"], capture_output=True, text=True,
                            timeout=120, env={"PATH": "/usr/bin:/bin",
                                              "NIGHTDESK_HOME": str(tmp_path),
                                              "COLUMNS": "40"})
    assert result.returncode in (0, 6), result.stderr
    rows = [line for line in result.stdout.splitlines() if "TICKER" in line]
    assert len(rows) == len(names), result.stdout
    assert all("Underweight" in row for row in rows), result.stdout



def test_every_command_prints_through_the_one_console_that_never_folds_a_pipe() -> None:
    # `plan` (fixed at 160 columns off a terminal) and `bench` (190 and 120, on a terminal
    # too) built consoles of their own, so a wide table folded its cells in a pipe. Only
    # app/cli/logs.py builds one; the live progress draws on a terminal alone.
    root = Path(__file__).resolve().parents[2] / "app"
    allowed = {root / "cli" / "logs.py", root / "recorder" / "progress.py"}
    builders = [str(path.relative_to(root)) for path in sorted(root.rglob("*.py"))
                if path not in allowed and "Console(" in path.read_text()]
    assert builders == []



def test_a_librarys_log_record_is_written_as_nightdesks_own_lines_are() -> None:
    # The standard library's records (APScheduler's, uvicorn's, alembic's) came out as
    # `WARNING:apscheduler.executors.default:Run time of job …` beside the JSON lines: a
    # library prefix in the journal, a line no JSON reader could take.
    code = ("import logging, structlog; from app.cli.logs import configure_logging; "
            "configure_logging(); structlog.get_logger('x').warning('ours'); "
            "logging.getLogger('some.library').warning('theirs %s', 'http://u:pw@h/')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    ours, theirs = (json.loads(line) for line in result.stderr.splitlines())
    assert (ours["event"], ours["level"]) == ("ours", "warning")
    assert set(ours) <= set(theirs), theirs
    assert (theirs["event"], theirs["level"], theirs["logger"]) == (
        f"theirs http://u:{MASK}@h/", "warning", "some.library")
