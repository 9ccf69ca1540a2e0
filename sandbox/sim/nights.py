"""The pool's clock: when its lending window is open, and its nights, in its own time zone.

Where it sits: the engine asks ``lendable`` which minutes of a trace the window lets a node be
lent in (the oracle lends nothing outside them, as the planner lets nothing stay lent there);
the report shades ``open_spans`` on its timelines and tables GPU-hours lent per night
(``nights``, ``lent_per_night``).

Why nights are noon to noon: a pool lends mostly at night, and a night spans two dates. Each
night here runs from 12:00 to 12:00 in the pool's zone and is named by its evening, so a night's
loans fall in one row whatever the window, and the rows add up to the run's total. Noon is a
wall-clock time: on a night the clocks change, the night is 23 or 25 hours long.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from rebalancer.core import windows

MINUTE = timedelta(minutes=1)
NOON = time(12)


def open_spans(
    window: windows.Window, start: datetime, end: datetime
) -> list[tuple[datetime, datetime]]:
    """The stretches ``[open, close)`` of ``window`` within ``[start, end)``, in order."""
    if window.always:
        return [(start, end)] if start < end else []
    spans = []
    at, is_open = start, window.is_open(start)
    opened = start
    while at < end:
        edge = window.next_edge(at)
        if edge is None or edge >= end:
            break
        if is_open:
            spans.append((opened, edge))
        opened, is_open, at = edge, not is_open, edge
    if is_open and opened < end:
        spans.append((opened, end))
    return spans


def lendable(window: windows.Window, start: datetime, minutes: int) -> list[bool] | None:
    """For each minute from ``start``, whether the window is open as it begins (when the
    planner decides); None when it is always open."""
    if window.always:
        return None
    end = start + MINUTE * minutes
    mask = [False] * minutes
    for opened, closed in open_spans(window, start, end):
        first = -((start - opened) // MINUTE)  # the first minute that begins inside
        last = -((start - closed) // MINUTE)  # the first minute that begins at or after close
        for t in range(max(0, first), min(minutes, last)):
            mask[t] = True
    return mask


@dataclass(frozen=True)
class Night:
    evening: date  # the date of its 12:00 start, in the pool's zone
    start: datetime  # UTC
    end: datetime  # UTC, the next day's 12:00 in the zone
    covered_minutes: int  # of it, the minutes the trace holds

    @property
    def minutes(self) -> int:
        return (self.end - self.start) // MINUTE

    @property
    def partial(self) -> bool:
        return self.covered_minutes < self.minutes


def nights(zone: str, start: datetime, end: datetime) -> list[Night]:
    """The nights (12:00 to 12:00 in ``zone``) that ``[start, end)`` touches, in order."""
    tz = ZoneInfo(zone)
    evening = (start.astimezone(tz) - timedelta(hours=12)).date()
    found: list[Night] = []
    while True:
        begin = _noon(evening, tz)
        if begin >= end:
            return found
        close = _noon(evening + timedelta(days=1), tz)
        covered = (min(close, end) - max(begin, start)) // MINUTE
        found.append(Night(evening, begin, close, covered))
        evening += timedelta(days=1)


def lent_per_night(
    times: Sequence[datetime], lent: Sequence[int], across: Sequence[Night]
) -> list[float]:
    """Node-hours lent in each night: ``lent[i]`` nodes for the minute that starts at
    ``times[i]`` (in order), summed per night."""
    hours = [0.0] * len(across)
    k = 0
    for when, count in zip(times, lent, strict=True):
        while k < len(across) and when >= across[k].end:
            k += 1
        if k == len(across):
            break
        if when >= across[k].start:
            hours[k] += count / 60.0
    return hours


def _noon(day: date, tz: ZoneInfo) -> datetime:
    return datetime.combine(day, NOON, tzinfo=tz).astimezone(UTC)
