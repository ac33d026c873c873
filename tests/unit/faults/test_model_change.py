"""The vLLM server restarted mid-night serving other weights under the same model name (a
``--served-model-name`` alias): the night stops rather than rank two models' answers
together; the same weights with another max-model-len go on
(docs/lab/2026-12-07-faults-outside-3.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF
from app.batch.engine import BatchPlan
from app.config import load_settings
from app.db.models import LLMCall
from app.runs.resumable import find_resumable
from tests.fakevllm import CONTEXT_LENGTH_MESSAGE, ChatRequest, FakeServer, Reply
from tests.fakevllm.chat import prompt_token_count
from tests.unit.support.bursts import TICKERS
from tests.unit.support.fault_night import (
    NODES,
    assert_rows_match_the_servers,
    night_engine,
    ticker_states,
)

MODEL = load_settings().llm.model
RESTART_AT = 12  # a chat request mid-night: the first ticker's analysts are answered


def restarted(server: list[FakeServer], **changed: Any) -> Any:
    """Crash the server at chat request RESTART_AT and bring it back 0.3 s later changed
    (``root``, ``max_model_len``); a prompt over its max-model-len is refused as vLLM does."""
    async def script(chat: ChatRequest) -> Reply | None:
        fake = server[0]
        if chat.index == RESTART_AT:
            fake.crash()

            def back() -> None:
                for name, value in changed.items():
                    setattr(fake, name, value)
                fake.revive()
            asyncio.get_running_loop().call_later(0.3, back)
            return Reply(drop=True)
        asked = prompt_token_count(chat.messages) + chat.body["max_tokens"]
        if asked > fake.max_model_len:
            return Reply(status=400, error=CONTEXT_LENGTH_MESSAGE)
        return None
    return script


def night(db: Engine, demo_dir: Path, server: FakeServer, **settings: Any) -> Any:
    engine = night_engine(db, demo_dir, server, **settings)
    engine.sample_metrics = True  # the night's /metrics readings, as in production
    return asyncio.run(engine.run(BatchPlan("nightly", DEMO_AS_OF, TICKERS)))


def test_a_server_back_with_other_weights_under_the_same_name_stops_the_night(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    holder: list[FakeServer] = []
    server = FakeServer(restarted(holder, root="/models/other-8b"), nodes=NODES,
                        tickers=TICKERS, model=MODEL, root="/models/first-1b")
    holder.append(server)
    outcome = night(sqlite_engine, demo_dir, server)
    assert outcome.status == "failed", outcome
    assert outcome.halt is not None
    line = outcome.halt.message
    assert "'/models/other-8b'" in line and "not '/models/first-1b'" in line, line
    stopped = str(outcome.halt.error(outcome.batch_id))
    assert stopped.startswith("batch 1 failed: the LLM server at ") and "\n" not in stopped
    # No answer of the other weights was taken: every chat answered came before the restart.
    assert not [c for c in server.chats if c.index > RESTART_AT and c.completed]
    assert_rows_match_the_servers(sqlite_engine, outcome.batch_id, [server])
    # Resumed against the server still serving the other weights: refused the same way,
    # before any call; against the first weights: finished, every attempt counted once.
    servers = [server]
    for weights, status in [("/models/other-8b", "failed"), ("/models/first-1b", "succeeded")]:
        again = FakeServer(nodes=NODES, tickers=TICKERS, model=MODEL, root=weights)
        servers.append(again)
        engine = night_engine(sqlite_engine, demo_dir, again)
        engine.sample_metrics = True
        resumed = asyncio.run(engine.run(find_resumable(sqlite_engine, 1, stale_s=120)))
        assert resumed.status == status, (resumed.failed, resumed.halt)
        assert (not again.chats) == (status == "failed")
    assert ticker_states(sqlite_engine, 1) == dict.fromkeys(TICKERS, ("succeeded", None))
    assert_rows_match_the_servers(sqlite_engine, 1, servers)


def test_a_server_back_with_the_same_weights_and_a_shorter_context_goes_on(
        sqlite_engine: Engine, demo_dir: Path) -> None:
    # The same weights, restarted with a shorter max-model-len that still holds the night's
    # prompts: how the model is served changed, not the model (resumable.py's MATCHED says
    # the same of a resume); the night is not stopped for it.
    holder: list[FakeServer] = []
    server = FakeServer(restarted(holder, max_model_len=2_100), nodes=NODES, tickers=TICKERS,
                        model=MODEL)
    holder.append(server)
    outcome = night(sqlite_engine, demo_dir, server, check_context_length=True)
    assert outcome.status == "succeeded", (outcome.failed, outcome.halt)
    assert ticker_states(sqlite_engine, outcome.batch_id) == dict.fromkeys(
        TICKERS, ("succeeded", None))
    with sqlite_engine.connect() as conn:
        refused = conn.execute(select(LLMCall.node).where(LLMCall.http_status == 400)).all()
    assert refused == []
    assert_rows_match_the_servers(sqlite_engine, outcome.batch_id, [server])
