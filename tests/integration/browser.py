"""Serve a database with a real ``nightdesk web`` process and read it in Debian's chromium.

Shared by the browser tests (test_web_browser.py, test_web_morning_browser.py); their
``browser`` and ``shots`` fixtures are in conftest.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tests.integration.tied import popen
from tests.integration.unattended import ROOT, free_port

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = "/usr/bin/chromium"
USER, PASSWORD = "operator", "browser-test-password"


@contextmanager
def served(env: dict[str, str], home: Path) -> Iterator[str]:
    """Run ``nightdesk web`` with ``env`` (its output in ``home/web.log``) until /healthz
    answers; yield its base URL; stop it with SIGTERM when the block ends."""
    port = free_port()
    log = (home / "web.log").open("w")
    web = popen([sys.executable, "-m", "app.cli", "web", "--port", str(port)],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"{base}/healthz", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                assert web.poll() is None, (home / "web.log").read_text()
                assert time.monotonic() < deadline, "nightdesk web did not come up"
                time.sleep(0.3)
        yield base
    finally:
        web.send_signal(signal.SIGTERM)
        web.wait(timeout=60)
        log.close()


def new_page(browser: Browser, credentials: bool = True) -> Page:
    """Return a page of a fresh context, signed in as USER unless ``credentials`` is false."""
    context = browser.new_context(
        http_credentials={"username": USER, "password": PASSWORD} if credentials else None,
        viewport={"width": 1280, "height": 900})
    return context.new_page()
