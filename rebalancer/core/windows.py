"""Lending windows: weekday sets and wall-clock spans in IANA time zones, DST-safe.

Syntax (docs/configuration.md, docs/design/windows.md), spans separated by ``;``::

    Mon-Fri 22:00-06:00 Asia/Shanghai; Sat,Sun 00:00-24:00 Asia/Shanghai

A span starts on each listed weekday at its start time and runs to its end time, on the next
day when the end is not after the start (``Fri 22:00-06:00`` covers Friday night into
Saturday morning). ``24:00`` is the end of the day. The zone is optional and defaults to the
pool's zone. ``always`` and ``never`` are windows too.

Times are wall-clock times in the zone, resolved to instants like a cron schedule would:
- a time skipped by a spring-forward change starts (or ends) the span at the change itself
  (02:30 on a night that jumps from 02:00 to 03:00 means 03:00);
- a time repeated by a fall-back change means its first occurrence, so a span that ends at
  01:30 on that night ends once and does not open again during the repeated hour.

Parsing returns a ``Window`` or a ``WindowError`` value; nothing here raises on bad input.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rebalancer.core import bounded

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_TIME = re.compile(r"^([01]?\d|2[0-4]):([0-5]\d)$")


@dataclass(frozen=True, slots=True)
class Span:
    days: frozenset[int]  # 0 = Monday
    start: int  # minutes after local midnight, 0..1439
    end: int  # minutes after local midnight, 1..1440; <= start means the next day
    zone: ZoneInfo

    def occurrence(self, day: date) -> tuple[datetime, datetime]:
        """The UTC instants this span opens and closes when it starts on ``day``."""
        end_day = day if self.end > self.start else day + timedelta(days=1)
        return _instant(day, self.start, self.zone), _instant(end_day, self.end, self.zone)


@dataclass(frozen=True, slots=True)
class Window:
    spans: tuple[Span, ...]
    text: str
    always: bool = False

    def is_open(self, now: datetime) -> bool:
        if self.always:
            return True
        return any(
            start <= now < end for start, end in self._occurrences(now, days_back=1, days_ahead=0)
        )

    def next_edge(self, now: datetime) -> datetime | None:
        """The next instant after ``now`` at which the window opens or closes (for wake-ups)."""
        if self.always:
            return None
        edges = sorted(
            {
                edge
                for pair in self._occurrences(now, days_back=1, days_ahead=8)
                for edge in pair
                if edge > now
            }
        )
        # Spans that touch or overlap (Sat 00:00-24:00; Sun 00:00-24:00), and a span a DST jump
        # leaves empty, have edges at which the window stays as it was: those are no edges.
        opened = self.is_open(now)
        return next((edge for edge in edges if self.is_open(edge) != opened), None)

    def _occurrences(
        self, now: datetime, days_back: int, days_ahead: int
    ) -> list[tuple[datetime, datetime]]:
        found: list[tuple[datetime, datetime]] = []
        for span in self.spans:
            found.extend(_around(span, now.astimezone(span.zone).date(), days_back, days_ahead))
        return found

    def __str__(self) -> str:
        return self.text


@functools.lru_cache(maxsize=1024)
def _around(
    span: Span, today: date, days_back: int, days_ahead: int
) -> tuple[tuple[datetime, datetime], ...]:
    """``span``'s occurrences that start from ``days_back`` + 1 days before ``today`` (the span
    may run into the next day) to ``days_ahead`` days after it. A function of its arguments
    alone, asked again every tick with the same local day: remembered, since resolving wall
    times in a zone was an eighth of a planner's tick."""
    return tuple(
        span.occurrence(day)
        for day in (today + timedelta(days=o) for o in range(-days_back - 1, days_ahead + 1))
        if day.weekday() in span.days
    )


ALWAYS = Window(spans=(), text="always", always=True)
NEVER = Window(spans=(), text="never")


@dataclass(frozen=True, slots=True)
class WindowError:
    text: str
    why: str

    def __str__(self) -> str:
        return f"window {bounded.quoted(self.text)}: {self.why}"


def parse(text: str, default_zone: str = "UTC") -> Window | WindowError:
    stripped = " ".join(text.split())
    if stripped.lower() == "always":
        return ALWAYS
    if stripped.lower() == "never":
        return NEVER
    if not stripped:
        return WindowError(text, "is empty; write e.g. 'Mon-Fri 22:00-06:00 UTC' or 'always'")
    spans = []
    parts = stripped.split(";")
    for part in parts:
        span = _parse_span(part.strip(), default_zone)
        if isinstance(span, str):
            # The part is named only when there are several: the text is quoted beside the
            # reason already, and quoting it twice doubles what an error copies.
            named = f"{bounded.quoted(part.strip())} {span}"
            return WindowError(text, named if parts[1:] else span)
        spans.append(span)
    return Window(spans=tuple(spans), text=stripped)


def _parse_span(part: str, default_zone: str) -> Span | str:
    fields = part.split(" ")
    if len(fields) not in (2, 3):
        return "needs days, a time range and an optional zone, e.g. 'Sat,Sun 00:00-24:00 UTC'"
    days = _parse_days(fields[0])
    if isinstance(days, str):
        return days
    times = fields[1].split("-")
    if len(times) != 2:
        return f"has time range {bounded.quoted(fields[1])}; write it as HH:MM-HH:MM"
    start, end = _parse_minutes(times[0]), _parse_minutes(times[1])
    if start is None or end is None:
        return f"has time range {bounded.quoted(fields[1])}; times are HH:MM from 00:00 to 24:00"
    if start == 1440:
        return "starts at 24:00; start the span at 00:00 of the next day instead"
    if start == end:
        return "starts and ends at the same time; use 00:00-24:00 for a whole day"
    if end == 0:
        end = 1440
    zone_name = fields[2] if len(fields) == 3 else default_zone
    try:
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a key naming a directory of the zone database ("America") is not a zone.
        shown = bounded.quoted(zone_name)
        return f"names unknown time zone {shown}; use an IANA name such as Europe/Berlin"
    return Span(days=days, start=start, end=end, zone=zone)


def _parse_days(text: str) -> frozenset[int] | str:
    lowered = text.lower()
    if lowered in ("*", "daily"):
        return frozenset(range(7))
    days: set[int] = set()
    for item in lowered.split(","):
        bounds = item.split("-")
        if len(bounds) > 2 or any(b[:3] not in DAYS or len(b) < 3 for b in bounds):
            return f"has days {bounded.quoted(text)}; write e.g. Mon-Fri, Sat,Sun, Fri-Mon or daily"
        first = DAYS.index(bounds[0][:3])
        last = DAYS.index(bounds[-1][:3])
        # A range may wrap over the week's end: Fri-Mon is Fri, Sat, Sun, Mon.
        days.update((first + i) % 7 for i in range((last - first) % 7 + 1))
    return frozenset(days)


def _parse_minutes(text: str) -> int | None:
    match = _TIME.match(text)
    if not match:
        return None
    minutes = int(match[1]) * 60 + int(match[2])
    return minutes if minutes <= 1440 else None


def _instant(day: date, minutes: int, zone: ZoneInfo) -> datetime:
    """The first UTC instant at which the wall clock in ``zone`` reads ``day`` + ``minutes``."""
    day = day + timedelta(days=minutes // 1440)
    wall = datetime.combine(day, time(minutes % 1440 // 60, minutes % 60))
    first = wall.replace(tzinfo=zone, fold=0)
    instant = first.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == wall:
        return instant  # the time exists; fold=0 is its first occurrence
    # Skipped by a spring-forward change: the first instant at or after that wall time is the
    # change itself. It lies between the two readings of the wall time; find it by bisection.
    lo = int(wall.replace(tzinfo=zone, fold=1).timestamp())
    hi = int(instant.timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, zone).replace(tzinfo=None) >= wall:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)
