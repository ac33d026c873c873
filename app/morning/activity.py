"""The time a batch's calls ran: its makespan less the pauses between them.

A resumed night's makespan spans the time it stood still; every throughput figure of a
batch (the report, the digest, ``/metrics``, the ETA's fallback rate) divides by this instead.
A pause is time the night stood still: stopped (a signal, a crash, an outage past its budget)
until a resume took it up, whatever its length, known from the resumes the batch records;
or, within one run, a minute or more with no call in flight (a server away, the process
frozen). Shorter gaps within a run are the night's own work between calls (storing, loading).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from pydantic.dataclasses import dataclass

# No call in flight for this long is a pause (the night stopped, crashed or waited to be
# resumed); shorter gaps are the night's own work between calls (storing, loading data).
PAUSE_MIN_S = 60.0


@dataclass(frozen=True)
class ActiveTime:
    """A batch's makespan split into the time its calls ran and the pauses between."""

    makespan_s: float
    active_s: float
    paused_s: float
    pauses: int


def active_time(intervals: list[tuple[datetime, datetime]],
                resumed: Iterable[datetime] = ()) -> ActiveTime:
    """Return the union of the calls' (start, end) intervals, gaps under ``PAUSE_MIN_S``
    bridged unless a resume (``resumed``: when each was) falls in them: the time every
    throughput figure of a batch divides by."""
    if not intervals:
        return ActiveTime(0.0, 0.0, 0.0, 0)
    spans = sorted(intervals)
    resumes = sorted(resumed)
    first, reach = spans[0]
    paused, pauses = 0.0, 0
    for start, end in spans[1:]:
        gap = (start - reach).total_seconds()
        if gap > 0 and (gap >= PAUSE_MIN_S or any(reach <= r <= start for r in resumes)):
            paused += gap
            pauses += 1
        reach = max(reach, end)
    makespan = (reach - first).total_seconds()
    return ActiveTime(makespan, makespan - paused, paused, pauses)
