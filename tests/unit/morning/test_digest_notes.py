"""The digest says what the ranking shows of a night's universe: its notes.

Reading a universe can change what the night runs: a duplicate removed, tickers that `--limit`
left out. That was said once, on stderr and in the journal (``universe note``), and nowhere
the morning looks: not the ranking, nor the digest. Now the batch keeps its notes and every
surface shows them alike: `ranking`, `report`, the ranking page, the batch page,
`/api/ranking` and the digest. Nights run with the real CLI on the demo data against the
fake server; the digest travels the real way (Apprise, HTTP, tests/webhook.py).
"""

from __future__ import annotations

import html
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agents.data.demo import demo_tickers
from tests.fakevllm import FakeServer
from tests.unit.support.clirun import run_cli
from tests.unit.support.fault_night import NODES, serve_cli_from
from tests.unit.support.webclient import AUTH
from tests.webhook import webhook


def every_surface_says(note: str, client: TestClient, digest: str) -> None:
    ranked = run_cli("ranking", env={"COLUMNS": "250"})
    assert ranked.code == 0 and f"universe note: {note}" in ranked.stdout.splitlines()
    assert f"universe note: {note}" in run_cli("report", env={"COLUMNS": "250"}).stdout
    batch = client.get("/api/ranking", auth=AUTH).json()["batch"]
    assert batch["notes"] == [note]
    for page in ("/", f"/batches/{batch['id']}"):
        assert f"Universe note: {note}" in html.unescape(client.get(page, auth=AUTH).text)
    assert f"Universe note: {note}" in digest.splitlines()


@pytest.mark.parametrize("how", ["a duplicate in --universe", "--limit"])
def test_a_universes_notes_are_shown_by_the_ranking_and_the_digest_alike(
        cli_env: None, demo_dir: Path, tmp_path: Path, client: TestClient,
        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    first, second, third = demo_tickers(3)
    serve_cli_from(monkeypatch, FakeServer(nodes=NODES, tickers=[first, second, third]),
                   demo_dir)
    if how == "--limit":
        argv = ["--limit", "2"]
        note = f"--limit 2 left out 1 of the universe's 3 tickers: {third}"
    else:
        universe = tmp_path / "universe.txt"
        universe.write_text(f"{first}\n{second}\n{first}\n")
        argv = ["--universe", str(universe)]
        note = f"removed duplicate ticker {first} (2 occurrences, kept the first)"
    with webhook() as hook:
        result = run_cli("run", *argv, "--no-preflight", env={"NIGHTDESK_NOTIFY": hook.url()})
    assert result.code == 0, result.stderr
    [post] = hook.posts
    every_surface_says(note, client, post["message"])
