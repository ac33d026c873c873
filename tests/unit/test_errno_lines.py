"""A path or an address nightdesk cannot use is one line in plain words, exit 2: never a
traceback, never the C library's "[Errno 21] " before the reason (serving.errors.reason and
app.errors.first_line drop it; a line that names the path already says the reason alone)."""

from __future__ import annotations

from pathlib import Path

from app.errors import first_line
from tests.unit.support.clirun import run_cli


def test_a_lock_file_that_cannot_be_opened_is_one_line(sqlite_url: str) -> None:
    # A folder where the SQLite database's lock file goes: a traceback from pathlib's open.
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    lock = database.with_name(database.name + ".nightly.lock")
    lock.mkdir(parents=True)
    done = run_cli("run", "--tickers", "AAA", "--as-of", "2026-11-27",
                   env={"NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1"})
    assert (done.code, done.error_lines) == (2, [
        f"error: cannot take the nightly lock: cannot open its file {lock}: Is a directory"]), \
        done.stderr


def test_a_settings_file_that_cannot_be_read_says_why_once() -> None:
    # A regular file whose read fails (the kernel's EIO): "[Errno 5] Input/output error".
    done = run_cli("ranking", env={"NIGHTDESK_CONFIG": "/proc/self/mem"})
    assert (done.code, done.error_lines) == (2, [
        "error: invalid settings file /proc/self/mem: Input/output error"]), done.stderr


def test_a_host_that_is_no_address_says_why_without_its_number() -> None:
    done = run_cli("web", "--host", "nonexistent.invalid",
                   env={"NIGHTDESK_WEB_PASSWORD": "pw"})
    assert done.code == 2 and len(done.error_lines) == 1, done.stderr
    assert "not an address to listen on (" in done.stderr and "Errno" not in done.stderr


def test_an_os_error_in_a_one_line_error_has_no_number(tmp_path: Path) -> None:
    # What a database's, a spool's or a checkpoint's path error reads as in a night's line.
    try:
        tmp_path.open()
    except OSError as error:
        said = first_line(error, typed=True)
    assert said == f"IsADirectoryError: Is a directory: '{tmp_path}'"
