"""Feed malformed tickers, universe files, dates and settings: never a traceback, never an
empty success. Each input ends in one error line and a non-zero exit, or in a success that is
checked against what the input asked for.
"""

from __future__ import annotations

import os
import re
import tempfile
from datetime import date
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agents.data.demo import COMPANIES
from agents.tickers import check_symbol, read_universe
from app.config import load_settings
from app.errors import ConfigError, InputError
from tests.unit.support.clirun import CliResult, run_cli
from tests.webhook import closed_port

# The rules as the README states them, written out here independently of the code.
VALID_SYMBOL = re.compile(r"(?=.*[A-Z0-9])[A-Z0-9.\-]{1,12}")
EXAMPLES = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

# Text an environment variable or a command line can carry (no NUL, no lone surrogates).
plain = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=40)
symbolish = st.text(st.sampled_from("ABCXYZ019.-_ $/a,\t\n#é"), max_size=16)


@pytest.fixture(scope="module")
def dead_server() -> str:
    """A base URL where nothing listens: a run that gets past its input stops at preflight."""
    return f"http://127.0.0.1:{closed_port()}/v1"


def is_date(text: str) -> bool:
    """Return True for a plain YYYY-MM-DD calendar date."""
    if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text) is None:
        return False
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def one_line_failure(result: CliResult) -> None:
    assert result.code != 0, result.stdout
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert len(result.error_lines) == 1, result.stderr


def expected_symbols(items: list[str]) -> list[str] | None:
    """Return the symbols a list of entries names, or None when one is invalid or none is."""
    symbols = [item.strip().upper() for item in items if item.strip()]
    if not symbols or not all(VALID_SYMBOL.fullmatch(s) for s in symbols):
        return None
    return list(dict.fromkeys(symbols))


@EXAMPLES
@given(raw=st.one_of(plain, symbolish))
def test_a_symbol_is_validated_or_refused_in_one_line(raw: str) -> None:
    try:
        symbol = check_symbol(raw)
    except InputError as error:
        assert "\n" not in str(error).strip()
        assert expected_symbols([raw]) is None or not raw.strip()
    else:
        assert symbol == raw.strip().upper() and VALID_SYMBOL.fullmatch(symbol)


@EXAMPLES
@given(lines=st.lists(st.one_of(symbolish, plain, st.just("# note"), st.just("")),
                      max_size=8))
def test_a_universe_file_gives_its_tickers_or_one_error(lines: list[str]) -> None:
    text = "\n".join(lines)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "universe.txt"
        path.write_text(text, encoding="utf-8")
        entries = [line.split("#", 1)[0] for line in text.splitlines()]
        want = expected_symbols(entries)
        try:
            got = read_universe(path)
        except InputError as error:
            assert "\n" not in str(error).strip()
            assert want is None
        else:
            assert got == want and got  # never an empty success


@pytest.mark.slow
@EXAMPLES
@given(tickers=st.one_of(symbolish, plain), as_of=st.one_of(plain, st.dates().map(str)))
def test_run_with_any_tickers_and_date_fails_in_one_line_naming_the_cause(
        dead_server: str, tickers: str, as_of: str) -> None:
    assume(not tickers.startswith("-") and not as_of.startswith("-"))
    result = run_cli("run", "--tickers", tickers, "--as-of", as_of,
                     env={"NIGHTDESK_LLM_BASE_URL": dead_server})
    one_line_failure(result)
    symbols_ok = expected_symbols(re.split(r"[,\s]+", tickers)) is not None
    date_ok = is_date(as_of)
    if not symbols_ok:
        assert "ticker" in result.stderr
    elif not date_ok:
        assert "--as-of" in result.stderr
    else:  # the input passed: the preflight refuses a date this home has no snapshot of
        assert "no snapshot for" in result.stderr and result.code == 2


@pytest.mark.slow
@EXAMPLES
@given(lines=st.lists(st.one_of(symbolish, plain), max_size=6))
def test_run_with_any_universe_file_fails_in_one_line(dead_server: str,
                                                      lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "u.txt"
        path.write_text("\n".join(lines), encoding="utf-8")
        result = run_cli("run", "--universe", str(path), "--as-of", "2026-11-27",
                         env={"NIGHTDESK_LLM_BASE_URL": dead_server})
    one_line_failure(result)


def test_a_duplicate_in_the_universe_is_noted_once(dead_server: str, tmp_path: Path) -> None:
    # The option's reader tells its notes; the night, which stores them, must not tell them
    # again as a log line (hypothesis found "0\n0": the note twice, one as a warning).
    path = tmp_path / "u.txt"
    path.write_text("AAA\nAAA\n", encoding="utf-8")
    result = run_cli("run", "--universe", str(path), "--as-of", "2026-11-27",
                     env={"NIGHTDESK_LLM_BASE_URL": dead_server})
    one_line_failure(result)
    assert sum("duplicate ticker AAA" in line for line in result.stderr.splitlines()) == 1


@pytest.mark.slow
@EXAMPLES
@given(count=st.one_of(st.integers(-5, len(COMPANIES) + 5).map(str), plain),
       as_of=st.one_of(st.dates(min_value=date(1990, 1, 1),
                                max_value=date(2030, 12, 31)).map(str), plain))
def test_demo_data_is_written_as_asked_or_refused_in_one_line(count: str, as_of: str) -> None:
    assume(not count.startswith("-") or count.lstrip("-").isdigit())
    assume(not as_of.startswith("-"))
    plainly_valid = (re.fullmatch(r"[0-9]+", count) is not None
                     and 1 <= int(count) <= len(COMPANIES)
                     and is_date(as_of))
    with tempfile.TemporaryDirectory() as folder:
        result = run_cli("data", "demo", "--tickers", count, "--as-of", as_of, "--out", folder)
        if result.code != 0:
            one_line_failure(result)
            assert not plainly_valid, result.stderr  # a plain valid request is never refused
            return
        # A success is checked against the request: that many tickers, for that day.
        day = date.fromisoformat(as_of)
        assert 1 <= int(count) <= len(COMPANIES)
        universe = Path(folder) / day.isoformat() / "universe.txt"
        listed = [line for line in universe.read_text().splitlines()
                  if line.strip() and not line.startswith("#")]
        assert len(listed) == int(count)


SETTINGS = {
    "NIGHTDESK_MAX_ATTEMPTS": st.one_of(st.integers(-3, 20).map(str), plain),
    "NIGHTDESK_TEMPERATURE": st.one_of(st.floats(allow_nan=True).map(str), plain),
    "NIGHTDESK_LLM_BASE_URL": st.one_of(plain, st.sampled_from(
        ["http://", "https://h:99999/v1", "ftp://h/v1", "http:/h", "h:8000", "http://h/v1"])),
    "NIGHTDESK_HEARTBEAT_STALE_S": st.one_of(st.floats(-10, 100).map(str), plain),
    "NIGHTDESK_OUTAGE_BUDGET_S": st.one_of(st.floats(-10, 1e6).map(str), plain),
    "NIGHTDESK_CHECKPOINT_DURABILITY": st.one_of(st.sampled_from(["sync", "exit", "SYNC"]),
                                                 plain),
    "NIGHTDESK_NODE_MAX_TOKENS": st.one_of(plain, st.sampled_from(
        ['{"analyst": 0}', '{"nobody": 5}', '{"trader": 64}', "[1, 2]", "{"])),
    "NIGHTDESK_DATABASE_URL": st.sampled_from(
        ["mysql://x/y", "", "not a url", "postgres:/", "sqlite+nonsense://",
         "sqlite:////proc/nope/x.db", "sqlite://user:pw@//tmp/x.db", "sqlite://host/x.db",
         "sqlite:////sys/nightdesk.db"]),
    "NIGHTDESK_LOG_LEVEL": st.one_of(plain, st.sampled_from(["debug", "WARNING", "Info"])),
    "NIGHTDESK_METRICS_INTERVAL_S": st.one_of(st.floats().map(str), plain),
}


@EXAMPLES
@given(env=st.fixed_dictionaries({}, optional=SETTINGS))
def test_settings_are_built_or_refused_in_one_line(env: dict[str, str]) -> None:
    assume(env)
    keep = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        built = load_settings()
    except ConfigError as error:
        message = str(error)
        assert "\n" not in message and message.startswith("invalid setting")
    else:
        # Accepted: every given value really is in force, within its documented range.
        assert 1 <= built.calls.max_attempts <= 10 and 0 <= built.sampling.temperature <= 2
        assert built.llm.base_url.split("://")[0] in ("http", "https")
        assert built.batch.heartbeat_stale_s > built.batch.heartbeat_interval_s
        assert all(v >= 1 for v in built.agents.node_max_tokens.values())
        assert built.log.level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        assert 0 < built.llm.metrics_interval_s < float("inf")
    finally:
        for key, value in keep.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.slow
@EXAMPLES
@given(env=st.fixed_dictionaries({}, optional=SETTINGS))
def test_a_command_with_any_settings_ends_in_one_line_or_its_output(env: dict[str, str]) -> None:
    assume(env)
    result = run_cli("ranking", "--format", "json", env=env)
    assert "Traceback" not in result.stderr
    # No batch exists, so even valid settings end in one line ("no batches recorded yet").
    one_line_failure(result)
