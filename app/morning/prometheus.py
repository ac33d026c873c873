"""The night's state as Prometheus metrics, read from what is stored at each scrape.

A custom collector (prometheus_client's ``Collector``): nothing is counted while a night runs,
so scraping can never slow the night; each scrape reads the latest night's status
(``app.morning.nightstatus``, the same the ranking page names), its ticker counts, duration
and batch-level output tok/s (``app.morning.accounting.throughput``), and the scheduler
daemon's heartbeat. docs/operations.md ("Metrics") lists every metric.

The three gauges of the latest night (tickers, duration, tok/s) are absent while the status
is ``stale``: the night due has no batch, and the previous one's figures are not tonight's.
The heartbeat is absent once the daemon stopped (a stop deletes its row, ``app.runs.daemon``); a
daemon that died leaves its last beat, which then ages.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from app.config import Settings
from app.db.engine import SchemaWatch
from app.db.models import FINISHED_STATUSES, Batch, nights_newest_first
from app.errors import first_line
from app.morning.accounting import throughput
from app.morning.nightstatus import STATUSES, NightBatch, NightStatus, night_status
from app.morning.ranking import ranked_night
from app.morning.summary import failed_tickers

log = structlog.get_logger(__name__)

PREFIX = "nightdesk"


def _seconds(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def _gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily | None:
    return None if value is None else GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class NightCollector(Collector):
    """Yield the night's metrics from the database at every scrape."""

    def __init__(self, engine: Engine, settings: Settings,
                 schema: SchemaWatch | None = None) -> None:
        """``schema``: the process's watch of the revision, shared with its pages."""
        self.engine = engine
        self.settings = settings
        self.schema = schema or SchemaWatch(engine)

    def collect(self) -> Iterable[Metric]:
        try:
            families = self._families()
        except Exception as error:  # a scrape answers; the gauge below says what went wrong
            log.error("metrics not read", error=first_line(error, 1000, typed=True))
            families = []
        up = GaugeMetricFamily(f"{PREFIX}_metrics_database_up",
                               "1 when this scrape could read the database", value=int(
                                   bool(families)))
        return [*families, up]

    def _families(self) -> list[Metric]:
        self.schema.check()  # migrated since the server started: that line, no reading
        status = night_status(self.engine, self.settings, ranked_night(self.engine))
        with self.engine.connect() as conn:
            # Of the latest date that has one, as the latest night is: an older date analyzed
            # again later (`run --as-of`) is no success of this morning's.
            last_success = conn.execute(nights_newest_first(Batch.status == "succeeded")
                                        .with_only_columns(Batch.finished_at)
                                        .limit(1)).scalar()
        families: list[GaugeMetricFamily | None] = [
            _gauge("night_last_success_timestamp_seconds",
                   "Unix time the newest nightly batch that succeeded finished, of the "
                   "latest as-of date that has one (0: none yet)",
                   _seconds(last_success) or 0.0),
            _labelled("night_last_status", "1 for the latest night's status (stale: none "
                      "came when due; none: no night ever ran), 0 for the others", "status",
                      {name: float(name == status.status) for name in STATUSES}),
            _gauge("night_ranking_fresh",
                   "1 when the ranking shows the latest night, 0 when it is older",
                   float(status.fresh)),
            _gauge("night_next_due_timestamp_seconds",
                   "Unix time the schedule fires the next night", _seconds(status.next_due_at)),
            _gauge("night_refused_timestamp_seconds",
                   "Unix time of the refusal that stands: a night refused at its start "
                   "since the night due, no later night started, or the resume of a night "
                   "that stopped short refused since it last ran (absent: none)",
                   # A fire's notice that the date was analyzed names no command: nothing
                   # was refused (the stale morning's reason still names it).
                   _seconds(status.refused.refused_at)
                   if status.refused and status.refused.command else None),
            _gauge("scheduler_heartbeat_timestamp_seconds",
                   "Unix time of the scheduler daemon's newest heartbeat",
                   _seconds(status.scheduler.beat_at) if status.scheduler else None),
        ]
        night = status.latest
        if night is not None and status.status != "stale":
            rerun = self._rated_by_reruns(night)
            families.append(_labelled(
                "night_tickers", "The latest nightly batch's tickers by outcome; missing: "
                "neither succeeded nor failed (not reached, interrupted); rerun: failed, "
                "rated since by a rerun the ranking applies (not counted failed)", "status",
                {"succeeded": night.tickers_succeeded, "failed": night.tickers_failed - rerun,
                 "missing": night.tickers_total - night.tickers_succeeded - night.tickers_failed,
                 "rerun": rerun}))
            families.append(_gauge("night_duration_seconds",
                                   "The latest night's start to end (to now while it runs, "
                                   "to the later of its last heartbeat and its last call's "
                                   "end once it died)",
                                   night.duration_s))
            rate = throughput(self.engine, night.id)
            families.append(_gauge("night_output_tokens_per_second",
                                   "The latest night's output tokens over the time its calls "
                                   "ran (pauses left out); absent under 1 s of calls",
                                   None if rate.brief else rate.output_tokens_per_s))
            families.append(_gauge("night_paused_seconds",
                                   "The latest night's pauses: time between its calls with "
                                   "none in flight (a resume's wait)", rate.paused_seconds))
        families.extend(self._eta(status))
        return [family for family in families if family is not None]

    def _rated_by_reruns(self, night: NightBatch) -> int:
        """Return how many of a ranked night's failed tickers later reruns the ranking
        applies have rated (``FailedTicker.rated_by``, as `report` and the batch page say
        it): the ranking shows them rated, the banner names none of them, and the advice
        passes them by (``rated_by_reruns``)."""
        if night.status not in FINISHED_STATUSES or not night.tickers_failed:
            return 0
        return sum(1 for failed in failed_tickers(self.engine, night.id)
                   if failed.rated_by is not None)

    @staticmethod
    def _eta(status: NightStatus) -> list[GaugeMetricFamily]:
        """The running night's time left and its interval (``eta``), the interval's ends
        only with the level they held (an uncalibrated range, level None, is none: every
        other face says "uncalibrated range"); absent otherwise."""
        prog = status.progress
        if status.status != "running" or prog is None or prog.eta_s is None:
            return []  # estimating: no number is made up (the page: "estimating… (why)")
        level = prog.eta_level if prog.eta_low_s is not None and prog.eta_high_s is not None \
            else None
        bounds: dict[str, float | None] = {"estimate": prog.eta_s} if level is None else {
            "estimate": prog.eta_s, "low": prog.eta_low_s, "high": prog.eta_high_s}
        return [family for family in (
            _labelled("night_eta_seconds", "The running night's time left (estimate) and, "
                      "where calibrated, its interval's ends (low, high); absent while "
                      "estimating (a first night before its first answered call)", "bound",
                      bounds),
            _gauge("night_eta_interval_level", "The share of replayed readings the running "
                   "night's ETA interval held (low to high); absent with no interval or an "
                   "uncalibrated range (no low, high)", level)) if family is not None]


def _labelled(name: str, doc: str, label: str, values: dict[str, float | None]
              ) -> GaugeMetricFamily:
    """Return a gauge with one sample per ``label`` value; None values are left out."""
    family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=[label])
    for key, value in values.items():
        if value is not None:
            family.add_metric([key], float(value))
    return family


def night_registry(engine: Engine, settings: Settings,
                   schema: SchemaWatch | None = None) -> CollectorRegistry:
    """Return a registry holding only the night's collector (no process metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NightCollector(engine, settings, schema))
    return registry
