"""``python -m tests.integration.slow_night DATA TICKERS DELAY_S``: run ``nightdesk run
--tickers TICKERS --no-preflight`` as a real process (the nightly lock, its heartbeat, its
runner recorded) against an in-process fake server whose every answer takes ``DELAY_S``,
on the snapshot in DATA; settings from the environment. A test holds its rows or kills it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def main() -> None:
    from agents.data.snapshot import SnapshotProvider
    from agents.graph import node_names
    from app.batch.engine import BatchEngine
    from app.cli import main as nightdesk
    from app.config import load_settings
    from tests.fakevllm import ChatRequest, FakeServer, Reply, default_reply

    data, tickers, delay_s = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])

    def slow(chat: ChatRequest) -> Reply:
        said = default_reply(chat)
        return (Reply(said, delay_s=delay_s) if isinstance(said, str)
                else Reply(**{**said.__dict__, "delay_s": delay_s}))

    server = FakeServer(slow, nodes=node_names(load_settings().pipeline()),
                        tickers=tickers.split(","))
    original = BatchEngine.__init__

    def with_fake(self: BatchEngine, *args: Any, **kwargs: Any) -> None:
        kwargs.update(http_client=server.client(), sample_metrics=False,
                      provider=SnapshotProvider(data))
        original(self, *args, **kwargs)

    BatchEngine.__init__ = with_fake  # type: ignore[method-assign]
    sys.argv = ["nightdesk", "run", "--tickers", tickers, "--no-preflight"]
    nightdesk()


if __name__ == "__main__":
    main()
