"""The scheduler daemon on a frozen clock: started without its wait, woken at chosen instants.

``running`` starts the daemon's own BlockingScheduler (stores, executor, job) without its
endless wait; ``tick`` runs the scheduler's loop body (``_process_jobs``) at an instant:
exactly what the daemon does when it wakes, minus the sleeping in between.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from datetime import time as clock
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import time_machine
from apscheduler.schedulers.base import STATE_STOPPED, BaseScheduler
from sqlalchemy import Engine

from app.config import load_settings
from app.runs.daemon import NightlyDaemon
from app.runs.nightly import NightlyResult

BERLIN = ZoneInfo("Europe/Berlin")


@dataclass
class Recorder:
    """Stand in for run_nightly: note each scheduled time it is given and when it ran."""

    fired: list[datetime] = field(default_factory=list)
    ran_at: list[datetime] = field(default_factory=list)

    def __call__(self, _settings: Any, *, engine: Engine, resume: bool,
                 skip_if_finished_since: datetime, server: str,
                 once_per_as_of: bool) -> NightlyResult:
        assert resume is True  # the daemon always continues a cut-short night
        assert server == "require"  # the preflight of `nightdesk run`, the model included
        self.fired.append(skip_if_finished_since)
        self.ran_at.append(datetime.now(UTC))
        return NightlyResult(None)


def daemon_for(engine: Engine, runner: Any, **overrides: Any) -> NightlyDaemon:
    settings = load_settings(**{"schedule_timezone": "Europe/Berlin", **overrides})
    return NightlyDaemon(settings, engine, runner=runner)


@contextmanager
def running(daemon: NightlyDaemon, at: datetime) -> Iterator[NightlyDaemon]:
    """Start the daemon's scheduler at ``at`` (schedule, stores, executor), not its wait loop."""
    with time_machine.travel(at, tick=False):
        daemon.schedule()
        daemon.scheduler._event = threading.Event()  # BlockingScheduler.start would make it
        BaseScheduler.start(daemon.scheduler)
    try:
        yield daemon
    finally:
        if daemon.scheduler.state != STATE_STOPPED:
            daemon.scheduler.shutdown(wait=False)


def tick(daemon: NightlyDaemon, at: datetime) -> None:
    """Wake the scheduler at ``at``: run what is due, move the job on."""
    with time_machine.travel(at, tick=False):
        daemon.scheduler._process_jobs()


def local(day: date, hour: int, minute: int, zone: ZoneInfo = BERLIN) -> datetime:
    return datetime.combine(day, clock(hour, minute), zone)


NIGHT = local(date(2026, 11, 28), 0, 10)


def batch_settings(demo_dir: Path) -> dict[str, Any]:
    return {"check_context_length": False, "retry_backoff_s": 0, "data_dir": demo_dir}
