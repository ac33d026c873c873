"""Check the web app over constructed rows: auth, CSRF, JSON shapes, reruns, one night at a time.

The rows are described in ``web_rows``; every expected value below is written out from
that description, not read back from the code under test.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from itsdangerous import URLSafeSerializer
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session

from agents.graph import node_names
from app.config import load_settings
from app.db.models import Batch, ServerSample, TickerRun
from app.web.auth import CSRF_COOKIE, Guard
from app.web.reruns import RerunJob, RerunQueue, cli_command
from app.web.server import create_app
from tests.unit.support.web_rows import D1, SAMPLES, T0, Ids, fill
from tests.unit.support.webclient import AUTH, PASSWORD, USER, web_client

FAKE_RERUN = """
import pathlib, sys, time
log, release = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with log.open("a") as f:
    f.write(" ".join(sys.argv[3:]) + "\\n")
deadline = time.monotonic() + 20
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("fake rerun done")
sys.exit(0 if release.exists() else 7)
"""


class FakeRerun:
    """A stand-in for ``nightdesk rerun``: logs its arguments, then waits to be released."""

    def __init__(self, tmp: Path) -> None:
        self.script = tmp / "fake_rerun.py"
        self.script.write_text(FAKE_RERUN)
        self.log = tmp / "reruns.log"
        self.release = tmp / "release"

    def command(self, job: RerunJob) -> list[str]:
        # The real command's arguments after the interpreter and ``-m app.cli``.
        return [sys.executable, str(self.script), str(self.log), str(self.release),
                *cli_command(job)[3:]]

    def started(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def ids(sqlite_engine: Engine) -> Ids:
    return fill(sqlite_engine)


@pytest.fixture
def fake(tmp_path: Path) -> FakeRerun:
    return FakeRerun(tmp_path)


@pytest.fixture
def client(sqlite_engine: Engine, fake: FakeRerun) -> Iterator[TestClient]:
    with web_client(sqlite_engine, reruns=RerunQueue(command=fake.command)) as c:
        yield c


def wait_for(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def csrf_from(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "the ticker page has no CSRF field"
    return found.group(1)


# --- auth ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/", "/ticker/AAA", "/batches", "/batches/1",
                                  "/batches/compare?ids=1,2", "/api/ranking",
                                  "/api/batches", "/api/batches/1", "/api/tickers/AAA"])
def test_every_page_and_api_needs_the_credentials(client: TestClient, ids: Ids,
                                                  path: str) -> None:
    bare = client.get(path)
    assert bare.status_code == 401
    assert bare.headers["www-authenticate"].startswith("Basic")
    assert client.get(path, auth=(USER, "wrong")).status_code == 401
    assert client.get(path, auth=("someone", PASSWORD)).status_code == 401
    assert client.get(path, auth=AUTH).status_code == 200


def test_each_api_route_serves_the_payload_its_schema_declares(client: TestClient,
                                                               ids: Ids) -> None:
    """The routes' payloads are models: the OpenAPI schema names each one's fields, in the
    order the JSON has them, so a client can rely on the schema."""
    schema = client.app.openapi()  # type: ignore[attr-defined]
    models = schema["components"]["schemas"]

    def declared(path: str) -> list[str]:
        found = schema["paths"][path]["get"]["responses"]["200"]["content"]
        ref = found["application/json"]["schema"]
        ref = ref.get("items", ref)["$ref"].rsplit("/", 1)[-1]
        return list(models[ref]["properties"])

    for route, path in [("/api/ranking", "/api/ranking"), ("/api/batches", "/api/batches"),
                        (f"/api/batches/{ids.night1}", "/api/batches/{batch_id}"),
                        (f"/api/batches/compare?ids={ids.night1},{ids.rerun}",
                         "/api/batches/compare"),
                        ("/api/tickers/AAA", "/api/tickers/{symbol}")]:
        served = client.get(route, auth=AUTH).json()
        first = served[0] if isinstance(served, list) else served
        assert list(first) == declared(path), route


def test_health_answers_without_credentials(client: TestClient) -> None:
    answer = client.get("/healthz")
    assert answer.status_code == 200 and answer.json() == {"status": "ok", "database": "ok"}


def test_without_a_password_everything_is_open(sqlite_engine: Engine, ids: Ids) -> None:
    app = create_app(sqlite_engine, Guard(USER, None), RerunQueue(), stale_after_s=120.0)
    with TestClient(app) as c:
        assert c.get("/").status_code == 200
        assert c.get("/api/ranking").json()["batch"]["id"] == ids.night1


# --- the ranking: one finished night, reruns applied, the running night only as progress -----

@pytest.mark.parametrize(("age_s", "status"), [(60, "running"), (200, "crashed")])
def test_a_running_night_is_crashed_past_the_age_the_cli_marks_it_crashed(
        sqlite_engine: Engine, age_s: float, status: str) -> None:
    # 200 s without a heartbeat: past heartbeat_stale_s (120), where `nightdesk report` or
    # `run` marks the batch crashed; the page says crashed too, and shows no progress.
    ids = fill(sqlite_engine, night2_heartbeat=datetime.now(UTC) - timedelta(seconds=age_s))
    stale_after = load_settings().batch.heartbeat_stale_s
    app = create_app(sqlite_engine, Guard(USER, None), RerunQueue(), stale_after_s=stale_after)
    with TestClient(app) as c:
        data = c.get("/api/ranking").json()
        listed = {b["id"]: b["status"] for b in c.get("/api/batches").json()}
    assert listed[ids.night2] == status
    assert [r["id"] for r in data["running"]] == ([ids.night2] if status == "running" else [])


def test_ranking_is_the_last_finished_night_with_its_rerun_while_the_next_runs(
        client: TestClient, ids: Ids) -> None:
    data = client.get("/api/ranking", auth=AUTH).json()
    assert data["batch"]["id"] == ids.night1 and data["batch"]["as_of"] == D1.isoformat()
    assert data["batch"]["demo"] is True
    rows = [(r["rank"], r["ticker"], r["rating"], r["score"], r["batch_id"], r["samples"])
            for r in data["rows"]]
    assert rows == [(1, "AAA", "Buy", 0.8, ids.night1, 2),
                    (2, "BBB", "Sell", -0.6, ids.rerun, 1)]
    assert data["rows"][0]["spread"] == 0.0
    assert data["failed"] == [{"ticker": "CCC", "status": "failed",
                               "reason": "LLMTimeoutError: no answer within 300 s"}]
    assert data["distribution"] == {"Buy": 1, "Overweight": 0, "Hold": 0, "Underweight": 0,
                                    "Sell": 1}
    assert data["reruns_applied"] == [ids.rerun]
    [running] = data["running"]
    assert (running["id"], running["as_of"], running["tickers_done"], running["tickers_total"],
            running["status"]) == (ids.night2, "2026-11-27", 1, 2, "running")

    html = client.get("/", auth=AUTH).text
    assert "as of 2026-11-26" in html and "DEMO DATA" in html
    assert f'data-batch="{ids.night2}"' in html and "is running" in html
    # Tonight's AAA (Sell −0.90, "collapse") is not on the page: no mix of two nights.
    assert "collapse" not in html and "-0.90" not in html
    table = html[html.index('<table id="ranking"'):html.index("</table>")]
    assert re.findall(r'data-ticker="(\w+)"', table) == ["AAA", "BBB"]
    assert "rating-buy" in table and "rating-sell" in table
    assert "CCC" in html and "LLMTimeoutError: no answer within 300 s" in html
    assert '<svg role="img" aria-label="ratings"' in html


def finish_night2_partial(engine: Engine, ids: Ids) -> None:
    """End night 2 as the engine ends a night with a failed ticker: ``partial``."""
    with Session(engine) as s:
        night2 = s.get(Batch, ids.night2)
        assert night2 is not None
        night2.status, night2.finished_at = "partial", datetime.now(UTC)
        night2.tickers_failed = 1
        bbb = s.query(TickerRun).filter_by(batch_id=ids.night2, ticker="BBB").one()
        bbb.status, bbb.error = "failed", "DecisionError: no valid decision after 3 attempts"
        s.commit()


def test_a_partial_night_is_the_ranking_and_names_the_ticker_it_lacks(
        client: TestClient, ids: Ids, sqlite_engine: Engine) -> None:
    finish_night2_partial(sqlite_engine, ids)
    data = client.get("/api/ranking", auth=AUTH).json()
    # The newest finished night, though not every ticker succeeded: never an older one.
    assert (data["batch"]["id"], data["batch"]["status"]) == (ids.night2, "partial")
    assert [(r["ticker"], r["rating"], r["score"]) for r in data["rows"]] == [
        ("AAA", "Sell", -0.9)]
    assert data["failed"] == [{"ticker": "BBB", "status": "failed",
                               "reason": "DecisionError: no valid decision after 3 attempts"}]
    assert data["running"] == []

    html = client.get("/", auth=AUTH).text
    assert "as of 2026-11-27" in html and "1 of 2 tickers succeeded" in html
    missing = html[html.index("Failed or missing tickers"):]
    assert "BBB" in missing and "no valid decision after 3 attempts" in missing
    # The ticker page and its history count the partial night as a finished one.
    aaa = client.get("/api/tickers/AAA", auth=AUTH).json()
    assert aaa["shown"]["id"] == ids.night2 and aaa["shown"]["status"] == "partial"
    assert [p["as_of"] for p in aaa["history"]] == ["2026-11-25", "2026-11-26", "2026-11-27"]


def test_ranking_page_before_any_finished_night(sqlite_engine: Engine) -> None:
    with web_client(sqlite_engine) as c:
        page = c.get("/", auth=AUTH)
        data = c.get("/api/ranking", auth=AUTH).json()
    assert page.status_code == 200 and "no finished nightly batch yet" in page.text
    assert data["batch"] is None and data["rows"] == []


# --- the ticker page --------------------------------------------------------------------------

def test_ticker_shows_17_nodes_in_graph_order_from_the_finished_night(
        client: TestClient, ids: Ids) -> None:
    data = client.get("/api/tickers/aaa", auth=AUTH).json()
    assert data["ticker"] == "AAA"
    shown = data["shown"]
    assert shown["id"] == ids.night1  # tonight's run is in a batch still running
    assert data["latest"]["batch_id"] == ids.night2
    sample0 = next(r for r in shown["runs"] if r["sample"] == 0)
    expected = node_names(load_settings().pipeline())
    assert len(expected) == 17 and expected[0] == "market" and expected[-1] == "portfolio_manager"
    assert [n["node"] for n in sample0["nodes"]] == expected
    assert [n["text"] for n in sample0["nodes"]] == [f"{n} says AAA <b>looks</b> fine"
                                                     for n in expected]
    assert sample0["decision"]["rating"] == "Buy"
    assert [(p["as_of"], p["rating"], p["score"]) for p in data["history"]] == [
        ("2026-11-25", "Hold", 0.05), ("2026-11-26", "Buy", 0.8)]

    html = client.get("/ticker/AAA", auth=AUTH).text
    assert html.count("<details") == 2 * 17  # two samples; sample 1 has no texts recorded
    assert "market says AAA &lt;b&gt;looks&lt;/b&gt; fine" in html  # escaped, never raw HTML
    assert 'aria-label="history"' in html and "Rerun AAA" in html


def test_ticker_history_applies_the_rerun(client: TestClient, ids: Ids) -> None:
    data = client.get("/api/tickers/BBB", auth=AUTH).json()
    assert [(p["as_of"], p["rating"], p["score"], p["batch_id"]) for p in data["history"]] == [
        ("2026-11-26", "Sell", -0.6, ids.rerun)]
    assert [r["batch_id"] for r in data["reruns"]] == [ids.rerun]


@pytest.mark.parametrize("path", ["/ticker/ZZZ", "/api/tickers/ZZZ", "/ticker/a%20b",
                                  "/batches/999", "/api/batches/999",
                                  "/api/batches/compare?ids=1,999"])
def test_unknown_things_are_404(client: TestClient, ids: Ids, path: str) -> None:
    assert client.get(path, auth=AUTH).status_code == 404


# --- batches --------------------------------------------------------------------------------

def test_batch_report_series_come_from_server_samples(client: TestClient, ids: Ids) -> None:
    data = client.get(f"/api/batches/{ids.night1}", auth=AUTH).json()
    series = data["series"]
    assert series["t"] == [float(at) for at, *_ in SAMPLES]
    assert series["running"] == [float(r) for _, r, *_ in SAMPLES]
    assert series["waiting"] == [float(w) for _, _, w, *_ in SAMPLES]
    assert series["kv"] == [kv for *_, kv, _ in SAMPLES]
    rates = [(b[4] - a[4]) / (b[0] - a[0]) for a, b in itertools.pairwise(SAMPLES)]
    assert series["tok_s"] == pytest.approx(rates)  # 50, 150, 50 tokens/s
    assert data["report"]["calls"] == 17
    assert data["server"]["running_max"] == 6.0 and data["server"]["preemptions"] == 0.0
    assert data["failed_tickers"] == [{"ticker": "CCC", "status": "failed",
                                       "error": "LLMTimeoutError: no answer within 300 s",
                                       "rated_by": None}]
    assert [n["node"] for n in data["report"]["nodes"]] == node_names(load_settings().pipeline())
    # Call i ran from i s to i + 1.5 s: a 17.5 s makespan in two 10 s intervals.
    over = data["over_time"]
    assert [(i["start_s"], i["end_s"]) for i in over] == [(0.0, 10.0), (10.0, 17.5)]
    assert [i["attempts_started"] for i in over] == [10, 7]
    assert sum(i["output_tokens_per_s"] * (i["end_s"] - i["start_s"]) for i in over) == (
        pytest.approx(data["report"]["completion_tokens"]))

    html = client.get(f"/batches/{ids.night1}", auth=AUTH).text
    for gid in ("throughput-0", "concurrency-0", "concurrency-1", "kv-0", "latency-market",
                "over-time"):
        assert f'id="{gid}"' in html, gid
    assert "10–18" in html  # the second interval's row (17.5 s shown whole)
    running_path = re.search(r'<g id="concurrency-0">\s*<path d="([^"]+)"', html)
    assert running_path and running_path.group(1).count("L") >= len(SAMPLES) - 1


def test_a_batch_on_two_endpoints_has_each_ones_series_and_their_sum(
        client: TestClient, ids: Ids, sqlite_engine: Engine) -> None:
    # Two servers' readings interleave in server_samples; each counter is its own server's,
    # so one series over both would subtract one server's token count from the other's.
    a, b = "http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1"
    start = T0 - timedelta(days=1)  # night1's first reading (tests/unit/support/web_rows.py)
    with Session(sqlite_engine) as s:
        s.query(ServerSample).filter_by(batch_id=ids.night1).update({"endpoint": a})
        for at, running, waiting, kv, gen in [(1, 2, 1, 0.20, 50_000), (3, 5, 0, 0.90, 50_300),
                                              (5, 1, 0, 0.30, 50_500)]:
            s.add(ServerSample(batch_id=ids.night1, endpoint=b,
                               sampled_at=start + timedelta(seconds=at), running=running,
                               waiting=waiting, kv_cache_usage=kv, preemptions_total=0,
                               prompt_tokens_total=0, generation_tokens_total=gen))
        s.commit()
    series = client.get(f"/api/batches/{ids.night1}", auth=AUTH).json()["series"]
    own = {e["endpoint"]: e for e in series["endpoints"]}
    assert list(own) == [a, b]
    assert own[a]["tok_s"] == pytest.approx([50, 150, 50])  # as when it served alone
    assert own[b]["tok_s"] == pytest.approx([150, 100]) and own[b]["t"] == [1.0, 3.0, 5.0]
    # The batch: each endpoint holds its last reading until its next.
    assert series["t"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert series["running"] == [1, 3, 6, 9, 11, 7, 4]
    assert series["waiting"] == [0, 1, 2, 1, 3, 3, 0]
    assert series["kv"] == [0.10, 0.20, 0.35, 0.90, 0.90, 0.80, 0.50]  # the fullest one's
    assert series["tok_s_t"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert series["tok_s"] == pytest.approx([50, 200, 300, 250, 150, 50])  # 1,000 tokens
    html = client.get(f"/batches/{ids.night1}", auth=AUTH).text
    # running and waiting summed, then each endpoint's running; KV: fullest, then each.
    for gid in ("concurrency-2", "concurrency-3", "kv-2", "throughput-3"):
        assert f'id="{gid}"' in html, gid


def test_batches_list_and_compare(client: TestClient, ids: Ids) -> None:
    listed = client.get("/api/batches", auth=AUTH).json()
    assert [b["id"] for b in listed] == [ids.night2, ids.rerun, ids.night1, ids.night0]
    assert [b["kind"] for b in listed] == ["nightly", "rerun", "nightly", "nightly"]
    both = client.get(f"/api/batches/compare?ids={ids.night1},{ids.rerun}", auth=AUTH).json()
    assert [a["batch_id"] for a in both["arms"]] == [ids.night1, ids.rerun]
    assert both["arms"][0]["running_max"] == 6.0
    page = client.get(f"/batches/compare?ids={ids.night1}&ids={ids.rerun}", auth=AUTH)
    assert page.status_code == 200 and "report --compare" in page.text
    assert client.get("/batches/compare?ids=1", auth=AUTH).status_code == 400
    assert client.get("/batches/compare?ids=x,y", auth=AUTH).status_code == 400


# --- reruns: CSRF, once per ticker ----------------------------------------------------------

def test_rerun_post_without_a_valid_csrf_token_is_403(client: TestClient, ids: Ids,
                                                      fake: FakeRerun) -> None:
    url = "/ticker/AAA/rerun"
    refused = client.post(url, auth=AUTH, follow_redirects=False)
    assert refused.status_code == 403 and "missing or wrong CSRF token" in refused.text
    token = csrf_from(client.get("/ticker/AAA", auth=AUTH).text)  # sets the cookie
    assert client.post(url, auth=AUTH, data={"csrf_token": "not-it"},
                       follow_redirects=False).status_code == 403
    # A token signed by some other key, in both places, is not ours.
    forged = URLSafeSerializer(b"another key", salt="csrf").dumps("x")
    client.cookies.set(CSRF_COOKIE, forged)
    assert client.post(url, auth=AUTH, data={"csrf_token": forged},
                       follow_redirects=False).status_code == 403
    client.cookies.set(CSRF_COOKIE, token)
    client.cookies.delete(CSRF_COOKIE)
    assert client.post(url, auth=AUTH, data={"csrf_token": token},
                       follow_redirects=False).status_code == 403  # no cookie
    time.sleep(0.2)
    assert fake.started() == []


def test_rerun_is_queued_once_and_its_state_shows(client: TestClient, ids: Ids,
                                                  fake: FakeRerun) -> None:
    token = csrf_from(client.get("/ticker/AAA", auth=AUTH).text)
    first = client.post("/ticker/AAA/rerun", auth=AUTH, data={"csrf_token": token},
                        follow_redirects=False)
    second = client.post("/ticker/AAA/rerun", auth=AUTH, data={"csrf_token": token},
                         follow_redirects=False)
    assert first.status_code == second.status_code == 303
    assert first.headers["location"] == "/ticker/AAA?notice=queued"
    assert second.headers["location"] == "/ticker/AAA?notice=already"
    wait_for(lambda: len(fake.started()) == 1)
    # The night on the ranking page, with its sample count.
    assert fake.started() == [f"rerun AAA --as-of {D1.isoformat()} --samples 2"]
    page = client.get("/ticker/AAA?notice=already", auth=AUTH).text
    assert "already queued or running" in page
    assert re.search(r'<button type="submit" id="rerun-button" disabled>', page)
    assert client.get("/api/tickers/AAA", auth=AUTH).json()["rerun_job"]["state"] == "running"

    fake.release.touch()
    wait_for(lambda: client.get("/api/tickers/AAA", auth=AUTH)
             .json()["rerun_job"]["state"] == "succeeded")
    assert len(fake.started()) == 1
    page = client.get("/ticker/AAA", auth=AUTH).text
    assert 'id="rerun-button" disabled' not in page
    # Finished, so a new request starts a new rerun.
    token = csrf_from(page)
    again = client.post("/ticker/AAA/rerun", auth=AUTH, data={"csrf_token": token},
                        follow_redirects=False)
    assert again.headers["location"] == "/ticker/AAA?notice=queued"
    wait_for(lambda: len(fake.started()) == 2)


def _running_rerun(engine: Engine, ticker: str, heartbeat: datetime) -> None:
    with Session(engine) as s:
        batch = Batch(kind="rerun", as_of=D1, status="running", created_at=heartbeat,
                      started_at=heartbeat, heartbeat_at=heartbeat, settings={},
                      tickers_total=1, tickers_succeeded=0, tickers_failed=0)
        s.add(batch)
        s.flush()
        s.add(TickerRun(batch_id=batch.id, ticker=ticker, status="running"))
        s.commit()


def test_a_rerun_running_elsewhere_is_not_started_twice(
        client: TestClient, ids: Ids, fake: FakeRerun, sqlite_engine: Engine) -> None:
    # Started by `nightdesk rerun BBB` in a shell: the page sees its live batch row.
    _running_rerun(sqlite_engine, "BBB", datetime.now(UTC))
    # CCC's rerun process died an hour ago: its row says running, its heartbeat says not.
    _running_rerun(sqlite_engine, "CCC", datetime.now(UTC) - timedelta(hours=1))
    token = csrf_from(client.get("/ticker/BBB", auth=AUTH).text)
    page = client.get("/ticker/BBB", auth=AUTH).text
    assert 'id="rerun-button" disabled' in page and "as batch" in page
    bbb = client.post("/ticker/BBB/rerun", auth=AUTH, data={"csrf_token": token},
                      follow_redirects=False)
    ccc = client.post("/ticker/CCC/rerun", auth=AUTH, data={"csrf_token": token},
                      follow_redirects=False)
    assert bbb.headers["location"] == "/ticker/BBB?notice=already"
    assert ccc.headers["location"] == "/ticker/CCC?notice=queued"
    wait_for(lambda: len(fake.started()) == 1)
    assert fake.started()[0].startswith("rerun CCC ")


# --- the rerun queue on its own -------------------------------------------------------------

async def test_queue_reports_a_failed_rerun_with_its_last_line(tmp_path: Path) -> None:
    def failing(job: RerunJob) -> list[str]:
        return [sys.executable, "-c",
                "import sys; print('working'); print('error: no snapshot for XYZ');"
                " sys.exit(2)"]

    async with RerunQueue(command=failing) as queue:
        job, created = queue.submit("XYZ", D1, 1)
        assert created
        await finished(job, 15)
    assert (job.state, job.exit_code, job.message) == ("failed", 2, "error: no snapshot for XYZ")


async def test_stopping_the_queue_stops_its_processes(tmp_path: Path) -> None:
    marker = tmp_path / "pid"

    def sleeper(job: RerunJob) -> list[str]:
        return [sys.executable, "-c",
                f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid()));"
                " time.sleep(60)"]

    async with RerunQueue(command=sleeper) as queue:
        running, _ = queue.submit("AAA", D1, 1)
        queued, _ = queue.submit("BBB", D1, 1)  # one slot: waits behind AAA
        deadline = time.monotonic() + 50  # a loaded host starts Python slowly
        while not (marker.exists() and marker.read_text()):
            assert time.monotonic() < deadline, "the rerun's process never started"
            await asyncio.sleep(0.05)
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 20  # SIGTERM ended it, not the 60 s sleep
    assert running.state == "failed" and running.message == "stopped with the web server"
    assert queued.state == "cancelled"
    pid = int(marker.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


async def test_a_rerun_stopped_while_its_process_starts_is_not_left_running(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spawning = asyncio.Event()

    async def never_started(*args: Any, **kwargs: Any) -> None:
        spawning.set()
        await asyncio.Event().wait()  # the web server stops before the process is up

    monkeypatch.setattr(asyncio, "create_subprocess_exec", never_started)
    async with RerunQueue() as queue:
        job, _ = queue.submit("AAA", D1, 1)
        await asyncio.wait_for(spawning.wait(), 5)
    assert (job.state, job.message) == ("failed", "stopped with the web server")
    assert job.finished_at is not None


async def finished(job: RerunJob, timeout: float) -> None:
    """Wait (inside the queue's lifetime) until the job has ended."""
    deadline = time.monotonic() + timeout
    while job.state in ("queued", "running"):
        assert time.monotonic() < deadline, f"rerun still {job.state}"
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_the_real_rerun_command_fails_in_one_line_for_an_unknown_ticker(
        sqlite_url: str) -> None:
    # The exact command the web server runs, against this test's (empty) database.
    async with RerunQueue(env={"NIGHTDESK_DATABASE_URL": sqlite_url,
                               "NIGHTDESK_LLM_BASE_URL": "http://127.0.0.1:9/v1"}) as queue:
        job, _ = queue.submit("NOSUCH", D1, 1)
        await finished(job, 60)
    assert job.state == "failed" and job.exit_code not in (None, 0)
    assert job.message and "Traceback" not in "\n".join(job.tail)


def test_a_page_whose_database_has_no_connection_left_answers_503_in_one_line(
        tmp_path: Path) -> None:
    # The server's refusal of a new connection (its words: libpq gives it no SQLSTATE),
    # met by a page's first statement: 503 and the CLI's line, not a 500 and a traceback.
    engine = create_engine(f"sqlite:///{tmp_path}/busy.db")

    @event.listens_for(engine, "do_connect")
    def _refuse(*_: Any) -> None:
        raise sqlite3.OperationalError('connection failed: FATAL:  too many connections for '
                                       'role "nightdesk"')

    app = create_app(engine, Guard(USER, None), RerunQueue(), stale_after_s=120.0)
    with TestClient(app, raise_server_exceptions=False) as c:
        for path in ("/", "/api/batches"):
            answer = c.get(path)
            assert answer.status_code == 503, answer.text[:300]
            assert "the database takes no connection now (" in answer.text
            assert "Traceback" not in answer.text
