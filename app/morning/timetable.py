"""The night's schedule: its zone, its trigger, and the last and next times a night is due.

The scheduler daemon fires on this trigger; the morning's status (nightstatus.py) reads the
same one to tell a night that never started ("stale") from one that is not due yet.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import tzlocal
from apscheduler.triggers.cron import CronTrigger

from app.config import Settings

# How far back the last due time is looked for: a monthly crontab line's gap, and some.
LOOKBACK = timedelta(days=40)


def schedule_zone(settings: Settings) -> tuple[ZoneInfo, str]:
    """Return the schedule's time zone and where it came from ("setting" or "host")."""
    if settings.schedule.timezone:
        return ZoneInfo(settings.schedule.timezone), "setting"
    host = tzlocal.get_localzone()
    return (host if isinstance(host, ZoneInfo) else ZoneInfo(str(host))), "host"


class NightlyTrigger(CronTrigger):
    """Fire a crontab schedule at most once per wall-clock time.

    APScheduler's CronTrigger follows the wall clock, so when summer time ends a time inside
    the repeated hour (02:30 in Europe/Berlin) matches twice, an hour apart; it documents
    this. A night must not run twice: a fire time whose local wall-clock time is not after
    the previous fire's is passed over.
    """

    def get_next_fire_time(self, previous_fire_time: datetime | None,
                           now: datetime) -> datetime | None:
        following: datetime | None = super().get_next_fire_time(previous_fire_time, now)
        if previous_fire_time is None:
            return following
        last = _wall(previous_fire_time, self.timezone)
        # Twice is enough: the repeated hour happens once a day at most; the bound only
        # guards against a trigger that keeps answering the same instant.
        for _ in range(2):
            if following is None or _wall(following, self.timezone) > last:
                return following
            # Step past it in UTC: wall-clock arithmetic would land back in the first pass.
            following = super().get_next_fire_time(
                following, following.astimezone(UTC) + timedelta(seconds=1))
        return following


def _wall(moment: datetime, zone: Any) -> datetime:
    """Return the naive local wall-clock time of ``moment`` (the fold forgotten)."""
    return moment.astimezone(zone).replace(tzinfo=None, fold=0)


def nightly_trigger(settings: Settings) -> NightlyTrigger:
    """Return the trigger of ``schedule_cron`` in the schedule's zone (the daemon's own)."""
    return NightlyTrigger.from_crontab(settings.schedule.cron, timezone=schedule_zone(settings)[0])


def due_times(trigger: CronTrigger, now: datetime) -> tuple[datetime | None, datetime | None]:
    """Return (the last fire time at or before ``now``, the first after it), aware in UTC.

    The last is None when the schedule has not fired within ``LOOKBACK``.
    """
    last: datetime | None = None
    fire: datetime | None = trigger.get_next_fire_time(None, now - LOOKBACK)
    while fire is not None and fire <= now:
        last = fire
        fire = trigger.get_next_fire_time(fire, fire + timedelta(seconds=1))
    return (None if last is None else last.astimezone(UTC),
            None if fire is None else fire.astimezone(UTC))
