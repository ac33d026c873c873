"""Each bad batch id or destination given to a command or a page: one line and exit 2 (the
CLI), 404 or 400 (the web), never a traceback or a 500.

Stored: nights 1 and 2 of universe AAA/BBB (DEMO data) and night 3 of universe XXX/YYY, so
``--against`` night 3 names a batch of another universe. Every expected line is written here
from the input, not read from the code.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from app.config import load_settings
from app.db.models import Batch
from tests.unit.support.clirun import run_cli
from tests.unit.support.night_rows import Rated, add_night, at
from tests.unit.support.webclient import AUTH, web_client

HUGE = "9" * 20  # beyond a signed 64-bit key
JUST_OVER = str(2**63)  # the first number no batch id can be
ARABIC = "١٢"  # str.isdigit() says yes; not a batch id
UNKNOWN = "424242"


@pytest.fixture
def nights(sqlite_engine: Engine) -> dict[str, int]:
    d1, d2, d3 = date(2026, 11, 25), date(2026, 11, 26), date(2026, 11, 27)
    good = {"AAA": Rated("Buy", 0.8), "BBB": Rated("Hold", 0.0)}
    return {"one": add_night(sqlite_engine, d1, at(d2, 0, 10), good),
            "two": add_night(sqlite_engine, d2, at(d3, 0, 10), good),
            "other": add_night(sqlite_engine, d3, at(date(2026, 11, 28), 0, 10),
                               {"XXX": Rated("Buy", 0.5), "YYY": Rated("Sell", -0.6)})}


# (command line, what its one error line must say); {two} and {other} are night ids.
CLI_CASES = [
    ("ranking --batch " + UNKNOWN, f"no batch with id {UNKNOWN}"),
    ("ranking --batch " + HUGE, "beyond any batch id"),
    ("ranking --batch " + ARABIC, "--batch takes a batch id"),
    ("ranking --batch -3", "--batch takes a batch id"),
    ("ranking --format json --batch " + JUST_OVER, "beyond any batch id"),
    ("changes --batch " + UNKNOWN, f"no batch with id {UNKNOWN}"),
    ("changes --batch " + HUGE, "beyond any batch id"),
    ("changes --batch " + ARABIC, "--batch takes a batch id"),
    ("changes --against " + UNKNOWN, f"no batch with id {UNKNOWN}"),
    ("changes --against " + HUGE, "--against: " + HUGE + " is beyond any batch id"),
    ("changes --against x", "--against takes a batch id"),
    ("changes --batch {two} --against {other}", "is of another universe than batch {two}"),
    ("changes --batch {other} --against {two}", "is of another universe than batch {other}"),
    ("changes --batch {two} --against {two}", "is the batch itself"),
    ("report " + UNKNOWN, f"no batch with id {UNKNOWN}"),
    ("report " + HUGE, "beyond any batch id"),
    ("report " + ARABIC, "takes a batch id"),
    # The argument is no --batch option (before: "--batch takes a batch id", an option that
    # `report` and `run` have not); a negative number is no option (before: "No such option").
    ("report abc", "error: batch_id takes a batch id, a whole number like 12 (got 'abc')"),
    ("run --resume abc", "error: batch_id takes a batch id, a whole number like 12"),
    ("report -1", "error: -1 is no option, nor a batch id (a batch id is a whole number"),
    ("report --compare {two}," + UNKNOWN, f"no batch with id {UNKNOWN}"),
    ("report --compare {two}," + HUGE, "--compare takes batch ids"),
    ("replay --batch " + UNKNOWN, f"no batch with id {UNKNOWN}"),
    ("replay --batch " + HUGE, "beyond any batch id"),
    ("run --resume " + UNKNOWN, f"no batch with id {UNKNOWN}"),
    ("run --resume " + HUGE, "beyond any batch id"),
    ("quality samples --batch " + UNKNOWN, f"no batch with id {UNKNOWN}"),
    ("quality samples --batch " + HUGE, "beyond any batch id"),
    ("quality forward --batch " + ARABIC, "--batch takes a batch id"),
    ("quality repro --batches {two}," + UNKNOWN, f"no batch with id {UNKNOWN}"),
    ("quality repro --batches {two}," + HUGE, "--batches takes batch ids"),
]


def _fill(text: str, ids: dict[str, int]) -> str:
    return text.format(**ids)


@pytest.mark.parametrize(("argv", "says"), CLI_CASES,
                         ids=[f"{i}-{c[0].split()[0]}" for i, c in enumerate(CLI_CASES)])
def test_a_bad_batch_id_is_one_line_and_exit_2(sqlite_engine: Engine, nights: dict[str, int],
                                               argv: str, says: str) -> None:
    result = run_cli(*_fill(argv, nights).split(),
                     env={"NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1"})
    assert "Traceback" not in result.stderr + result.stdout
    assert result.code == 2, result.stderr
    assert len(result.error_lines) == 1, result.stderr
    line = result.error_lines[0]
    assert line.startswith("error: ") and _fill(says, nights) in line, line
    with sqlite_engine.connect() as conn:  # nothing recorded: no batch added
        assert conn.execute(select(func.count()).select_from(Batch)).scalar() == 3


# A destination Apprise cannot read, in NIGHTDESK_NOTIFY: refused at start by any command.
NOTIFY_CASES = [("jsn://127.0.0.1/x", "ranking"), ("json://", "batches"),
                ("json://127.0.0.1:9000/x, slack://", "changes"), ("127.0.0.1:9000", "report")]


@pytest.mark.parametrize(("value", "command"), NOTIFY_CASES)
def test_a_malformed_apprise_url_is_one_line_and_exit_2(
        nights: dict[str, int], value: str, command: str) -> None:
    result = run_cli(command, env={"NIGHTDESK_NOTIFY": value})
    assert result.code == 2 and "Traceback" not in result.stderr
    [line] = result.error_lines
    assert line.startswith("error: invalid setting NIGHTDESK_NOTIFY: "), line


@pytest.fixture
def client(sqlite_engine: Engine) -> Iterator[TestClient]:
    with web_client(sqlite_engine, settings=load_settings(schedule_timezone="UTC"),
                    raise_server_exceptions=False) as c:
        yield c


# (path, status): a path that names no batch is 404 (an unknown id, or text that is no id),
# a bad query value 400; never 422 with the validator's dump, never 500.
WEB_CASES = [
    (f"/batches/{UNKNOWN}", 404), (f"/api/batches/{UNKNOWN}", 404),
    (f"/batches/{HUGE}", 404), (f"/api/batches/{HUGE}", 404),
    (f"/batches/{JUST_OVER}", 404), (f"/api/batches/{JUST_OVER}", 404),
    (f"/batches/{ARABIC}", 404), (f"/api/batches/{ARABIC}", 404),
    ("/batches/-1", 404), ("/api/batches/x", 404),
    (f"/batches/compare?ids={{two}},{UNKNOWN}", 404),
    (f"/api/batches/compare?ids={{two}},{UNKNOWN}", 404),
    (f"/batches/compare?ids={{two}},{HUGE}", 400),
    (f"/api/batches/compare?ids={{two}},{HUGE}", 400),
    (f"/api/batches/compare?ids={{two}},{ARABIC}", 400),
    ("/track?nights=x", 400), (f"/track?nights={HUGE}", 400), ("/track?nights=0", 400),
    ("/track?horizon=zz", 400),
]


@pytest.mark.parametrize(("path", "status"), WEB_CASES,
                         ids=[f"{i}-{c[1]}" for i, c in enumerate(WEB_CASES)])
def test_a_bad_batch_id_in_a_url_is_404_or_400_never_500(
        client: TestClient, nights: dict[str, int], path: str, status: int) -> None:
    response = client.get(_fill(path, nights), auth=AUTH)
    assert response.status_code == status, response.text[:300]
    if "/api/" in path:
        detail = response.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail, detail
    else:
        assert "Traceback" not in response.text


def test_a_good_id_still_answers(client: TestClient, nights: dict[str, int]) -> None:
    # The table above must not pass by refusing everything.
    assert client.get(f"/api/batches/{nights['two']}", auth=AUTH).status_code == 200
    assert client.get(f"/batches/{nights['two']}", auth=AUTH).status_code == 200
    result = run_cli("changes", "--batch", str(nights["two"]), "--against",
                     str(nights["one"]), "--format", "json")
    assert result.code == 0, result.stderr
