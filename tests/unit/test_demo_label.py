"""The DEMO label comes from what a night was set to run on, not from the data it loaded.

A night over the demo snapshot whose every ticker's prices file is unreadable loads no data
at all and fails; it still ran on the demo snapshot, and says so in ``nightdesk batches``,
on /batches and in its digest. A night on market data (a snapshot whose manifest says
``demo: false``) is not labelled.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from sqlalchemy import Engine

from agents.data import get_provider, serves_demo
from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from app.config import load_settings
from app.morning.digest import build_digest
from tests.unit.support.clirun import run_cli
from tests.unit.support.engines import fake_llm
from tests.unit.support.webclient import AUTH, web_client


def snapshot(tmp_path: Path, demo: bool) -> Path:
    """Write the demo snapshot of two tickers, its prices unreadable; ``demo`` in its manifest."""
    data = tmp_path / "data"
    day = write_demo(data, DEMO_AS_OF, 2)
    manifest = day / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "demo": demo}))
    for ticker in demo_tickers(2):
        (day / ticker / "prices.csv").write_text("not,a\nprices,file\n")
    return data


@pytest.mark.parametrize("demo", [True, False])
def test_a_night_that_loaded_no_data_is_labelled_by_its_snapshot(
        monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine, tmp_path: Path,
        demo: bool) -> None:
    data = snapshot(tmp_path, demo)
    tickers = demo_tickers(2)
    fake_llm(monkeypatch, None, tickers)
    result = run_cli("run", "--tickers", ",".join(tickers), "--as-of", str(DEMO_AS_OF),
                     "--no-preflight", env={"NIGHTDESK_DATA_DIR": str(data),
                                            "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false"})
    assert result.code == 1, result.stderr  # every ticker failed: the night failed
    [night] = json.loads(run_cli("batches", "--format", "json").stdout)
    assert (night["status"], night["tickers_failed"], night["demo"]) == ("failed", 2, demo)
    title = build_digest(sqlite_engine, load_settings(), night["id"]).message.title
    assert title.startswith("DEMO DATA — ") == demo
    with web_client(sqlite_engine, settings=load_settings()) as client:
        page = BeautifulSoup(client.get("/batches", auth=AUTH).text, "html.parser")
    row = page.find("tr", attrs={"data-batch": str(night["id"])})
    assert row is not None and (row.find(class_="demo") is not None) == demo


def test_the_providers_say_whether_they_serve_demo_data(tmp_path: Path) -> None:
    real = snapshot(tmp_path / "real", demo=False)
    fake = snapshot(tmp_path / "fake", demo=True)
    assert serves_demo(get_provider("demo"), DEMO_AS_OF)
    assert serves_demo(get_provider("snapshot", fake), DEMO_AS_OF)
    assert not serves_demo(get_provider("snapshot", real), DEMO_AS_OF)
    # No snapshot of that date: nothing says it is demo data.
    assert not serves_demo(get_provider("snapshot", fake),
                           DEMO_AS_OF.replace(year=DEMO_AS_OF.year - 1))


@pytest.mark.parametrize("demo", [True, False])
def test_every_cli_face_of_a_night_says_whether_it_ran_on_demo_data(
        sqlite_engine: Engine, demo: bool) -> None:
    # Two nights with a rating change between them, on the DEMO snapshot or on market data:
    # each table says DEMO DATA exactly when they ran on it, each JSON and CSV carries it.
    from datetime import timedelta

    from tests.unit.support.night_rows import SETTINGS, Rated, add_night, at

    settings = {**SETTINGS, "demo_data": demo}
    before, after = DEMO_AS_OF - timedelta(days=1), DEMO_AS_OF
    add_night(sqlite_engine, before, at(after, 0, 10), {"AAA": Rated("Buy", 0.7),
                                                          "BBB": Rated("Hold", 0.0)},
              settings=settings)
    add_night(sqlite_engine, after, at(after + timedelta(days=1), 0, 10),
              {"AAA": Rated("Sell", -0.7), "BBB": Rated("Hold", 0.0)}, settings=settings)
    tables = {command: run_cli(command).stdout for command in ("batches", "changes", "ranking")}
    for command, text in tables.items():
        assert ("DEMO DATA" in text) == demo, (command, text)
    # Each night's row of `batches`: both ran on the same data.
    rows = [line for line in tables["batches"].splitlines() if "nightly" in line]
    assert len(rows) == 2 and all(("DEMO DATA" in row) == demo for row in rows), rows
    changes = json.loads(run_cli("changes", "--format", "json").stdout)
    assert changes["demo"] is demo and changes["changes"]
    header, *lines = run_cli("changes", "--format", "csv").stdout.splitlines()
    assert header.split(",")[-1] == "demo" and lines
    assert all(line.split(",")[-1] == str(demo) for line in lines), lines
    assert all(b["demo"] is demo for b in json.loads(run_cli("batches", "--format",
                                                              "json").stdout))


def test_a_comparison_marks_the_arms_that_ran_on_demo_data(sqlite_engine: Engine) -> None:
    # One night on the DEMO snapshot, one on market data, side by side: the table marks the
    # demo arm's row alone, the JSON carries `demo` for each, the web page badges its column.
    from datetime import timedelta

    from tests.unit.support.night_rows import SETTINGS, Rated, add_night, at

    nights = {demo: add_night(sqlite_engine, DEMO_AS_OF - timedelta(days=days),
                              at(DEMO_AS_OF, 0, 10) - timedelta(days=days),
                              {"AAA": Rated("Buy", 0.7)}, settings={**SETTINGS, "demo_data": demo})
              for days, demo in ((1, True), (0, False))}
    ids = f"{nights[True]},{nights[False]}"
    table = run_cli("report", "--compare", ids, env={"COLUMNS": "250"}).stdout
    rows = {int(line.split()[1]): line for line in table.splitlines()
            if line.split()[1:2] in ([str(nights[True])], [str(nights[False])])}
    assert {night: "DEMO DATA" in row for night, row in rows.items()} == {
        nights[True]: True, nights[False]: False}, table
    arms = json.loads(run_cli("report", "--compare", ids, "--format", "json").stdout)
    assert [(a["batch_id"], a["demo"]) for a in arms] == [(nights[True], True),
                                                           (nights[False], False)]
    with web_client(sqlite_engine, settings=load_settings()) as client:
        page = BeautifulSoup(client.get(f"/batches/compare?ids={ids}", auth=AUTH).text,
                             "html.parser")
    heads = page.select("#compare thead th")[1:]
    assert [head.find(class_="demo") is not None for head in heads] == [True, False]


@pytest.mark.parametrize("demo", [True, False])
def test_a_refused_night_is_labelled_wherever_the_refusal_is_shown(
        sqlite_engine: Engine, tmp_path: Path, demo: bool) -> None:
    # Its digest's title lacked the label every other face of a demo night carries, and so
    # did the stored refusal the page, `ranking` and /api name.
    from app.morning.nightstatus import night_status
    from app.runs.preflight import refusal_demo
    from tests.webhook import closed_port, webhook

    data = tmp_path / "data"
    manifest = write_demo(data, DEMO_AS_OF, 2) / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "demo": demo}))
    env = {"NIGHTDESK_DATA_DIR": str(data), "NIGHTDESK_CHECK_CONTEXT_LENGTH": "false",
           "NIGHTDESK_LLM_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1"}
    with webhook() as hook:
        result = run_cli("run", "--continue-night", env={**env, "NIGHTDESK_NOTIFY": hook.url()})
        assert result.code == 2 and "cannot reach" in result.stderr, result.stderr
    [post] = hook.posts
    assert post["title"].startswith("DEMO DATA — nightdesk: night of ") == demo, post
    settings = load_settings(data_dir=str(data))
    status = night_status(sqlite_engine, settings, None)
    assert status.refused is not None and status.reason is not None
    label = f"DEMO DATA — night of {DEMO_AS_OF} REFUSED at its start"
    said = {"status": status.reason,
            "ranking": " ".join(run_cli("ranking", env={**env, "COLUMNS": "300"}).stderr.split())}
    with web_client(sqlite_engine, settings=settings) as client:
        banner = BeautifulSoup(client.get("/", auth=AUTH).text, "html.parser").find(id="banner")
        said["page"] = " ".join(banner.get_text().split()) if banner else ""
        said["api"] = client.get("/api/ranking", auth=AUTH).json()["night"]["refused"]["title"]
    assert {face: label in text for face, text in said.items()} == dict.fromkeys(said, demo)
    assert all(f"night of {DEMO_AS_OF} REFUSED" in text for text in said.values()), said
    # A night whose date is not known yet (the daemon's missed fire): the newest snapshot's.
    assert refusal_demo(settings, None) == demo
