"""Check that a batch keeps every node's text, in graph order, exactly as the server sent it."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, select

from agents.data.demo import DEMO_AS_OF, demo_tickers, write_demo
from agents.graph import node_names
from app.batch.engine import BatchPlan
from app.config import load_settings
from app.db.models import NodeText
from tests.fakevllm import ChatRequest, FakeServer, Reply
from tests.unit.support.engines import make_engine


async def test_batch_keeps_each_nodes_text_in_graph_order(sqlite_engine: Engine,
                                                          tmp_path: Path) -> None:
    write_demo(tmp_path / "data", DEMO_AS_OF, 2)
    tickers = demo_tickers(2)
    names = node_names(load_settings().pipeline())

    def script(chat: ChatRequest) -> Reply | None:
        if chat.node == "news" and chat.sample == 1:
            return Reply("news\x00 with a NUL byte")  # PostgreSQL would refuse the NUL
        return None

    server = FakeServer(script, nodes=names, tickers=tickers, samples=range(2))
    settings = load_settings(check_context_length=False, retry_backoff_s=0)
    engine = make_engine(sqlite_engine, tmp_path / "data", server, settings)
    outcome = await engine.run(BatchPlan("nightly", DEMO_AS_OF, tickers, samples=2))
    assert outcome.status == "succeeded", outcome.failed

    # What the fake answered last for each (ticker, node, sample): the text a node kept.
    answered = {(c.ticker, c.node, c.sample): c.served.content
                for c in server.chats if c.served is not None}
    with sqlite_engine.connect() as conn:
        rows = conn.execute(select(NodeText).order_by(NodeText.ticker, NodeText.sample,
                                                      NodeText.position)).all()
    assert len(rows) == 2 * 2 * 17
    for ticker in tickers:
        for sample in (0, 1):
            mine = [r for r in rows if r.ticker == ticker and r.sample == sample]
            assert [r.node for r in mine] == names
            assert [r.position for r in mine] == list(range(17))
            for r in mine:
                expected = answered[(ticker, r.node, sample)].replace("\x00", "")
                assert r.text == expected and r.batch_id == outcome.batch_id
    assert {r.text for r in rows if r.node == "news" and r.sample == 1} == {
        "news with a NUL byte"}
