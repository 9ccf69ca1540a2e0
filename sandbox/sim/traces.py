"""Load traces: read a file into demand per minute, the simulator's unit of time.

Two formats, told apart by their header:

- per-minute request counts, as in the Azure LLM inference 2024 week
  (``minute_start_utc,service,requests,...``); ``--service`` picks one service;
- generic ``time,rps``: RFC 3339 UTC times and requests per second, at any regular spacing
  (each value holds until the next row). A spacing longer than the usual one is a gap: those
  minutes have no sample (``None``), which the simulator treats as a metrics outage, never as
  zero load.

Every problem is a ``TraceError`` naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rebalancer.errors import TraceError

MINUTE = timedelta(minutes=1)
MAX_VALUE = 1e12  # requests (or per second): far above any pool, far below float overflow


@dataclass(frozen=True)
class Trace:
    name: str
    source: str
    start: datetime  # the first minute, UTC
    rps: list[float | None]  # demand per minute; None where the trace has no sample
    native_step: timedelta  # the spacing of the file's own rows

    @property
    def minutes(self) -> int:
        return len(self.rps)

    @property
    def end(self) -> datetime:
        return self.start + MINUTE * len(self.rps)

    @property
    def gap_minutes(self) -> int:
        return sum(1 for v in self.rps if v is None)

    @property
    def peak(self) -> float:
        return max((v for v in self.rps if v is not None), default=0.0)


def load(path: Path, service: str | None = None) -> Trace:
    try:
        with path.open(newline="") as handle:
            rows = list(_rows(csv.reader(handle)))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a text CSV file ({exc.reason})") from exc
    if not rows:
        raise TraceError(f"{path}: empty file; expected a header and rows")
    header = [h.strip() for h in rows[0][1]]
    if "minute_start_utc" in header and "requests" in header:
        return _per_minute(path, header, rows[1:], service)
    if header[:2] == ["time", "rps"]:
        if service is not None:
            raise TraceError(f"{path}: a time,rps trace has one series; drop --service")
        return _time_rps(path, rows[1:])
    raise TraceError(
        f"{path}: line 1: unknown header {','.join(header)!r}; expected "
        "'minute_start_utc,service,requests,...' or 'time,rps'"
    )


def _rows(reader: Iterator[list[str]]) -> Iterator[tuple[int, list[str]]]:
    for number, row in enumerate(reader, start=1):
        if row and not row[0].startswith("#"):
            yield number, row


def _per_minute(
    path: Path, header: list[str], rows: list[tuple[int, list[str]]], service: str | None
) -> Trace:
    col_time, col_requests = header.index("minute_start_utc"), header.index("requests")
    col_service = header.index("service") if "service" in header else None
    if col_service is not None:
        services = sorted({row[col_service] for _, row in rows if len(row) > col_service})
        if service is None and len(services) > 1:
            raise TraceError(
                f"{path}: holds services {', '.join(services)}; pick one with --service"
            )
        if service is not None and service not in services:
            raise TraceError(
                f"{path}: no service {service!r}; it holds {', '.join(services) or 'none'}"
            )
        service = service or (services[0] if services else None)
    points = []
    for number, row in rows:
        if col_service is not None and row[col_service] != service:
            continue
        when = _time(path, number, "minute_start_utc", _field(path, number, row, col_time))
        count = _number(path, number, "requests", _field(path, number, row, col_requests))
        points.append((number, when, count / 60.0))
    name = f"{path.stem}:{service}" if service else path.stem
    return _to_minutes(path, name, points, MINUTE)


def _time_rps(path: Path, rows: list[tuple[int, list[str]]]) -> Trace:
    points = []
    for number, row in rows:
        when = _time(path, number, "time", _field(path, number, row, 0))
        points.append((number, when, _number(path, number, "rps", _field(path, number, row, 1))))
    if len(points) < 2:
        raise TraceError(f"{path}: needs at least two rows to know its spacing")
    spacing = Counter(b[1] - a[1] for a, b in itertools.pairwise(points))
    step = spacing.most_common(1)[0][0]
    return _to_minutes(path, path.stem, points, step)


def _to_minutes(
    path: Path, name: str, points: list[tuple[int, datetime, float]], step: timedelta
) -> Trace:
    if not points:
        raise TraceError(f"{path}: no rows for this series")
    if step < MINUTE or step % MINUTE:
        raise TraceError(f"{path}: rows are {step} apart; the spacing must be whole minutes")
    start = points[0][1]
    if start.second or start.microsecond:
        raise TraceError(f"{path}: line {points[0][0]}: time {start} is not on a whole minute")
    rps: list[float | None] = []
    for (number, when, value), following in zip(points, [*points[1:], None], strict=True):
        expected = start + MINUTE * len(rps)
        if when < expected:
            raise TraceError(
                f"{path}: line {number}: time {when:%Y-%m-%dT%H:%M:%SZ} is not after the row "
                "before it; rows must be in time order, one per step"
            )
        rps.extend([None] * ((when - expected) // MINUTE))
        span = step if following is None else min(step, following[1] - when)
        rps.extend([value] * max(1, span // MINUTE))
    return Trace(name=name, source=str(path), start=start, rps=rps, native_step=step)


def _field(path: Path, number: int, row: list[str], index: int) -> str:
    if index >= len(row):
        raise TraceError(f"{path}: line {number}: has {len(row)} fields, needs {index + 1}")
    return row[index].strip()


def _time(path: Path, number: int, field: str, text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise TraceError(
            f"{path}: line {number}: {field}={text!r} is not an RFC 3339 time in UTC "
            "(e.g. 2024-05-10T00:00:00Z)"
        )
    return when.astimezone(UTC)


def _number(path: Path, number: int, field: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise TraceError(f"{path}: line {number}: {field}={text!r} is not a number >= 0")
    if value > MAX_VALUE:
        raise TraceError(
            f"{path}: line {number}: {field}={text!r} is above {MAX_VALUE:g}, no load a pool serves"
        )
    return value
