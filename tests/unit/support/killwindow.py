"""Kill a batch process at an exact point of its checkpoint writes, then resume it.

``python -m tests.unit.support.killwindow --data DIR --tickers A,B --kill WHERE:NODE --log FILE``
runs a nightly batch of those tickers (one sample each, ``fixed-1``, so only the last
ticker's thread is at work when it dies) against the in-process fake server, on the
database of ``NIGHTDESK_DATABASE_URL``, and ends the process with ``os._exit(137)``, as a
SIGKILL would, where ``WHERE`` says, in the last ticker's thread:

- ``checkpoint``: NODE's writes are stored and its step's checkpoint is about to be: the
  window a kill leaves LangGraph's thread with ``next == ()`` and the step's tasks pending;
- ``writes``: inside the saver's ``aput_writes`` for NODE, the usage rows drained and the
  node's writes not stored (the writes of NODE's parallel siblings stored before it);
- ``record``: NODE's call has its whole answer from the server and its usage row is not
  recorded yet.

Every chat request the fake server receives is appended to ``FILE`` as it arrives, so what
the killed process sent is known after it died. ``kill_then_resume`` runs that process and
resumes its batch in this one with ``resume_recorded``, as ``nightdesk run --resume N`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF

ROOT = Path(__file__).resolve().parents[3]
KILLED = 137
Key = tuple[str, str, int]


def written_nodes(writes: Sequence[tuple[str, Any]]) -> set[str]:
    """Return the nodes whose outputs a task's checkpoint writes carry."""
    return {name for channel, value in writes if channel == "outputs" for name in value}


@dataclass
class Window:
    """Where to die, and what the target thread has stored so far."""

    where: str
    node: str
    ticker: str
    stored: set[str] = field(default_factory=set)
    writing: set[asyncio.Task[Any]] = field(default_factory=set)
    siblings_stored: asyncio.Event = field(default_factory=asyncio.Event)

    def targets(self, config: Any) -> bool:
        return str(config["configurable"]["thread_id"]).endswith(f":{self.ticker}:0")

    def siblings(self) -> set[str]:
        from agents.nodes import ANALYSTS

        return set(ANALYSTS) - {self.node} if self.node in ANALYSTS else set()


def arm(window: Window) -> None:
    """Wrap the stock savers' writes (under the guarded ones) and the usage recorder."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from app.usage import UsageRecorder

    for saver in (AsyncSqliteSaver, AsyncPostgresSaver):
        put_writes: Callable[..., Awaitable[None]] = saver.aput_writes
        put: Callable[..., Awaitable[Any]] = saver.aput

        async def aput_writes(self: Any, config: Any, writes: Sequence[tuple[str, Any]],
                              task_id: str, task_path: str = "",
                              _original: Callable[..., Awaitable[None]] = put_writes) -> None:
            if not window.targets(config):
                return await _original(self, config, writes, task_id, task_path)
            nodes = written_nodes(writes)
            if window.where == "writes" and window.node in nodes:
                os._exit(KILLED)  # the usage rows are drained (guarded saver), writes not
            task = asyncio.current_task()
            assert task is not None
            window.writing.add(task)
            try:
                await _original(self, config, writes, task_id, task_path)
            finally:
                window.writing.discard(task)
            window.stored |= nodes
            if window.siblings() <= window.stored:
                window.siblings_stored.set()
            return None

        async def aput(self: Any, config: Any, checkpoint: Any, metadata: Any,
                       new_versions: Any, _original: Callable[..., Awaitable[Any]] = put
                       ) -> Any:
            outputs = checkpoint["channel_values"].get("outputs", {})
            if window.where == "checkpoint" and window.targets(config) and window.node in outputs:
                # LangGraph stores a step's writes beside its checkpoint, not before it: wait
                # for them, so the kill falls where they are stored and the checkpoint not.
                while window.writing:
                    await asyncio.wait(set(window.writing))
                assert window.node in window.stored, window.stored
                os._exit(KILLED)
            return await _original(self, config, checkpoint, metadata, new_versions)

        saver.aput_writes = aput_writes  # type: ignore[method-assign]
        saver.aput = aput  # type: ignore[method-assign]

    record_call = UsageRecorder.record_call

    def record(self: UsageRecorder, row: dict[str, Any]) -> None:
        if (window.where == "record" and (row["ticker"], row["node"]) == (window.ticker,
                                                                          window.node)
                and row["status"] == "ok"):
            os._exit(KILLED)  # the answer is whole at the client; its row is not recorded
        record_call(self, row)

    UsageRecorder.record_call = record  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    """Run the batch that dies; return 0 only if it was not killed (the test then fails)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--tickers", required=True)
    parser.add_argument("--kill", required=True)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args(argv)

    import httpx

    from agents.data.snapshot import SnapshotProvider
    from agents.graph import node_names
    from app.batch.engine import BatchEngine, BatchPlan
    from app.config import load_settings
    from app.db.engine import get_engine
    from app.runs.checkpoints import Checkpoints
    from tests.fakevllm import ChatRequest, FakeServer, Reply

    tickers = args.tickers.split(",")
    where, node = args.kill.split(":")
    window = Window(where, node, tickers[-1])
    arm(window)
    log = args.log.open("a", buffering=1)  # a line is written through before the next one

    async def script(chat: ChatRequest) -> Reply | None:
        log.write(json.dumps([chat.ticker, chat.node, chat.sample]) + "\n")
        if (chat.ticker, chat.node) == (window.ticker, window.node) and window.siblings():
            await window.siblings_stored.wait()  # answer last in its step
        return None

    async def run() -> str:
        settings = load_settings(retry_backoff_s=0.01)
        server = FakeServer(script, nodes=node_names(settings.pipeline()), tickers=tickers,
                            samples=range(1))
        db = get_engine(settings.store.database_url)
        runner = BatchEngine(settings, db,
                             http_client=httpx.AsyncClient(transport=server.transport()),
                             provider=SnapshotProvider(args.data), sample_metrics=False,
                             checkpoints=Checkpoints(settings.store.database_url, db))
        outcome = await runner.run(BatchPlan("nightly", DEMO_AS_OF, tickers, 1, "fixed-1"))
        return outcome.status

    print(f"not killed: the batch ended {asyncio.run(run())}", file=sys.stderr)
    return 0


# --- the test's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class Resumed:
    """What the killed run sent, what the resume sent, and the ok rows of the batch."""

    sent_before: Counter[Key]
    sent_after: Counter[Key]
    ok_rows: Counter[Key]
    tickers: dict[str, str]  # ticker -> status
    status: str
    prompts_after: list[str]  # the node prompts the resume sent

    @property
    def sent_again(self) -> set[Key]:
        return set(self.sent_before) & set(self.sent_after)


def kill_then_resume(db_url: str, engine: Engine, data: Path, folder: Path, tickers: list[str],
                     kill: str, monkeypatch: pytest.MonkeyPatch) -> Resumed:
    """Run the batch in a process that dies at ``kill``; resume it here; return what happened."""
    from agents.data.snapshot import SnapshotProvider
    from agents.graph import node_names
    from app.batch.engine import BatchEngine
    from app.config import get_settings, load_settings
    from app.db.models import Batch, LLMCall, TickerRun
    from app.runs.nightly import resume_recorded
    from tests.fakevllm import FakeServer

    monkeypatch.setenv("NIGHTDESK_DATABASE_URL", db_url)
    get_settings.cache_clear()
    log = folder / f"sent-{kill.replace(':', '-')}.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run(
        [sys.executable, "-m", "tests.unit.support.killwindow", "--data", str(data),
         "--tickers", ",".join(tickers), "--kill", kill, "--log", str(log)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert child.returncode == KILLED, child.stderr[-3000:]
    sent_before = Counter(tuple(json.loads(line)) for line in log.read_text().splitlines())
    with engine.connect() as conn:
        batch_id = conn.execute(select(Batch.id)).scalar_one()

    server = FakeServer(nodes=node_names(load_settings().pipeline()), tickers=tickers,
                        samples=range(1))
    original = BatchEngine.__init__

    def with_fake(self: BatchEngine, *args: Any, **kwargs: Any) -> None:
        kwargs.update(http_client=server.client(), sample_metrics=False,
                      provider=SnapshotProvider(data))
        original(self, *args, **kwargs)

    monkeypatch.setattr(BatchEngine, "__init__", with_fake)
    result = resume_recorded(load_settings(retry_backoff_s=0.01), engine, batch_id)
    assert result.outcome is not None
    with engine.connect() as conn:
        ok_rows = Counter((r.ticker, r.node, r.sample) for r in conn.execute(
            select(LLMCall.ticker, LLMCall.node, LLMCall.sample)
            .where(LLMCall.batch_id == batch_id, LLMCall.status == "ok")))
        runs = {r.ticker: r.status for r in conn.execute(
            select(TickerRun.ticker, TickerRun.status).where(TickerRun.batch_id == batch_id))}
    sent_after = Counter((str(c.ticker), str(c.node), int(c.sample or 0))
                         for c in server.served())
    return Resumed(sent_before, sent_after, ok_rows, runs, result.outcome.status,
                   [c.user for c in server.served()])


def check_resumed(resumed: Resumed, tickers: list[str], kill: str) -> None:
    """Assert every ticker succeeded and count what the kill made the server do twice."""
    from agents.graph import node_names
    from app.config import load_settings

    where, node = kill.split(":")
    every = {(t, n, 0) for t in tickers for n in node_names(load_settings().pipeline())}
    assert resumed.status == "succeeded", resumed.tickers
    assert resumed.tickers == dict.fromkeys(tickers, "succeeded")
    assert set(resumed.ok_rows) == every  # every node has its row
    # Between them the two runs sent every node; the resume sent only what was not stored.
    assert set(resumed.sent_before) | set(resumed.sent_after) == every
    # The stored writes were applied once: no debate turn shows twice in a later prompt.
    from agents.nodes import TITLES

    for prompt in resumed.prompts_after:
        for title in TITLES.values():
            for round_ in (1, 2):
                assert prompt.count(f"### {title}, round {round_}\n") <= 1, (title, round_)
    cut = (tickers[-1], node, 0)
    if where == "checkpoint":
        # The node's writes were stored: nothing is sent again, every call has one ok row.
        assert resumed.sent_again == set()
        assert resumed.ok_rows == Counter(every)
    elif where == "writes":
        # The one call whose row was stored and whose writes were not is the one made again;
        # both calls were real and each has its row. Its siblings' stored writes are used.
        assert resumed.sent_again == {cut}
        assert resumed.ok_rows == Counter(every) + Counter([cut])
    else:
        # The remaining window: the server finished the call, its row was not recorded. It
        # is sent again, and only the call that was recorded counts.
        assert where == "record"
        assert resumed.sent_again == {cut}
        assert resumed.sent_before[cut] + resumed.sent_after[cut] == 2
        assert resumed.ok_rows == Counter(every)


if __name__ == "__main__":
    sys.exit(main())


# An analyst of the parallel step, chain nodes, the last step; inside aput_writes with the
# step's other writes stored; and the window left open (a finished call not yet recorded).
KILLS = ["checkpoint:market", "checkpoint:bull_r1", "checkpoint:trader",
         "checkpoint:portfolio_manager", "writes:news", "writes:research_manager",
         "record:bear_r2"]
