"""The one recorder of a batch: its live progress while the tickers run, and its admission
summaries at the end, from the control objects the engine hands it (``Recording`` in
app/batch/engine.py)."""

from __future__ import annotations

from rich.console import Console
from sqlalchemy import Engine

from app.db.batchsettings import FallbackRecord
from app.recorder import figures
from app.recorder.figures import Admission, HoldBackTimeline
from app.recorder.progress import BatchProgress
from app.traffic.server import ServerSet
from app.traffic.strategy import Strategy


class Recorder:
    """Record one batch run: attach a fresh one to each ``BatchEngine.run``; after it,
    ``admission`` and ``holdback`` say how admission ended (None: the run never started)."""

    def __init__(self, engine: Engine | None = None, console: Console | None = None) -> None:
        """``engine``: where the batch's rows are, read for the ETA and given its progress
        readings (None: no ETA); ``console``: where the progress shows (stderr)."""
        self.engine = engine
        self.console = console
        self.admission: Admission | None = None
        self.holdback: HoldBackTimeline | None = None

    def watch(self, batch_id: int, tickers: int, expected_calls: int | None,
              servers: ServerSet, strategy: Strategy) -> BatchProgress:
        self.servers, self.strategy = servers, strategy
        self.progress = BatchProgress(batch_id, tickers, servers, self.console,
                                      expected_calls=expected_calls, engine=self.engine)
        return self.progress

    def ticker_done(self, ok: bool) -> None:
        self.progress.ticker_done(ok)

    def fallback(self) -> FallbackRecord | None:
        return figures.fallback(self.servers)

    def finished(self) -> Admission:
        self.admission = figures.admission(self.servers, self.strategy)
        self.holdback = figures.holdback_timeline(self.servers)
        return self.admission
