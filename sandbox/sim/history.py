"""A pool's own demand history from Prometheus, as a trace (``rebalancer simulate --prometheus``).

Where it sits: the simulate command resolves the settings, the pool and the time span, and
hands them here. This module reads the pool's demand minute by minute through the metrics
adapter (``read_range``: the pool's own demand query, one-minute steps, a day per request,
the adapter's retries), decides what to do with the minutes that have no sample
(``fill``, pure), writes the result as a ``time,rps`` trace file, and loads that file back with
``traces.load``. The replay then is the ``--trace`` path's, on the very file a later
``--trace`` run reads, so the two cannot drift apart.

Why a gap is not zero: a minute with no sample is a metrics outage, and the simulator treats an
outage as the controller does (no lending, then reclaims), never as a pool at rest. Why short
gaps are held: the controller itself hands the planner the last sample until it is older than
the pool's staleness limit (``limits.staleness``, 2 minutes by default), so a missed scrape or
two changed nothing in the cluster and should change nothing in the what-if.
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

from rebalancer import errors
from rebalancer.adapters import metrics, ranges
from rebalancer.adapters.promql import MetricQuery
from rebalancer.core.model import MetricError, PoolName
from rebalancer.errors import ConfigError, TraceError
from sandbox.sim import traces

MINUTE = timedelta(minutes=1)
LONGEST = timedelta(days=400)  # the most history one --since reads


class GapKind(StrEnum):
    HELD = "held"  # no longer than the hold: the last value carried over it
    OUTAGE = "outage"  # longer: left without a sample, replayed as a metrics outage
    EDGE = "edge"  # before the first sample or after the last: outside the trace


@dataclass(frozen=True)
class Gap:
    start: datetime
    minutes: int
    kind: GapKind

    @property
    def end(self) -> datetime:
        return self.start + MINUTE * self.minutes

    def line(self) -> str:
        what = {
            GapKind.HELD: "held at the last value",
            GapKind.OUTAGE: "no sample: replayed as a metrics outage",
            GapKind.EDGE: "no sample: outside the trace",
        }[self.kind]
        return f"gap {_rfc3339(self.start)} to {_rfc3339(self.end)} ({self.minutes} min): {what}"


@dataclass(frozen=True)
class Filled:
    start: datetime  # the first minute with a sample
    rps: list[float | None]  # to the last minute with a sample; None in an outage
    gaps: list[Gap]


@dataclass(frozen=True)
class Source:
    """Where the history comes from: the settings' Prometheus, the pool and its query."""

    settings: metrics.Settings  # with the pool's queries
    pool: PoolName
    node_selector: dict[str, str]
    nodes: list[str] | None  # None: ask kube_node_labels for the selector's nodes


@dataclass(frozen=True)
class History:
    trace: traces.Trace  # as loaded back from ``path``
    path: Path
    gaps: list[Gap]
    requests: int
    nodes: list[str]


def window(
    since: str | None, start: str | None, end: str | None, now: datetime
) -> tuple[datetime, datetime]:
    """The minutes ``[from, to)`` the flags name: from ``--since`` up to ``now``, or ``--from``
    and ``--to``; each rounded down to the minute. Raises a one-line ``ConfigError``.

    ``--since`` is a TIME as ``rebalancer audit --since`` reads it (``http.parse_time``, the
    same function): an RFC 3339 time, or a time ago (``14d``, ``36h``, ``1d12h``, ``90m``),
    so that one flag has one meaning across the commands."""
    if since is not None and (start is not None or end is not None):
        raise ConfigError(f"--since={since!r}: give either --since or --from and --to, not both")
    if since is not None:
        until = _minute(now)
        first = _since(since, now)
        if until - first < 2 * MINUTE:
            raise ConfigError(f"--since={since!r}: must be at least 2 minutes ago")
        if until - first > LONGEST:
            raise ConfigError(f"--since={since!r}: must be at most 400d ago")
        return first, until
    if start is None or end is None:
        missing = "--from" if start is None else "--to"
        raise ConfigError(f"--prometheus needs --since TIME, or --from and --to ({missing})")
    first, last = _time("--from", start), _time("--to", end)
    if last - first < 2 * MINUTE:
        raise ConfigError(f"--to={end!r}: must be at least 2 minutes after --from={start!r}")
    return first, last


def _since(text: str, now: datetime) -> datetime:
    from rebalancer.runtime import http

    try:
        return _minute(http.parse_time("since", text.strip(), now))
    except http.BadParameter as exc:
        raise ConfigError(f"--since={errors.shown(text)}: {exc.message}") from None


def _time(flag: str, text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ConfigError(
            f"{flag}={text!r}: not an RFC 3339 time with its offset, e.g. 2024-05-10T00:00:00Z"
        )
    return _minute(when)


def _minute(when: datetime) -> datetime:
    return when.astimezone(UTC).replace(second=0, microsecond=0)


def fill(start: datetime, raw: Sequence[float | None], hold: int) -> Filled:
    """The gap policy. Leading and trailing minutes without a sample are cut off (``EDGE``); a
    run of at most ``hold`` minutes between two samples takes the value before it (``HELD``);
    a longer run stays without a sample (``OUTAGE``). Every run is reported."""
    present = [i for i, v in enumerate(raw) if v is not None]
    if not present:
        return Filled(start, [], [Gap(start, len(raw), GapKind.EDGE)] if raw else [])
    first, last = present[0], present[-1]
    gaps = [Gap(start, first, GapKind.EDGE)] if first else []
    rps: list[float | None] = []
    i = first
    while i <= last:
        if raw[i] is not None:
            rps.append(raw[i])
            i += 1
            continue
        j = i
        while raw[j] is None:
            j += 1
        run = j - i
        held = run <= hold
        rps.extend([rps[-1] if held else None] * run)
        gaps.append(Gap(start + MINUTE * i, run, GapKind.HELD if held else GapKind.OUTAGE))
        i = j
    if last < len(raw) - 1:
        gaps.append(Gap(start + MINUTE * (last + 1), len(raw) - 1 - last, GapKind.EDGE))
    return Filled(start + MINUTE * first, rps, gaps)


def write_trace(path: Path, start: datetime, rps: Sequence[float | None]) -> None:
    """``time,rps``, one row per minute with a value (``repr``: the float reads back exactly);
    an outage is the rows left out, which ``traces.load`` reads back as minutes without one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        out = csv.writer(handle, lineterminator="\n")
        out.writerow(["time", "rps"])
        for i, value in enumerate(rps):
            if value is not None:
                out.writerow([_rfc3339(start + MINUTE * i), repr(value)])


def load(
    source: Source,
    first: datetime,
    until: datetime,
    hold: int,
    out: Path,
    chunk: timedelta = ranges.RANGE_CHUNK,
) -> History:
    """Read, fill, write ``out/trace-<pool>.csv`` and ``out/history.json``, load the trace
    back. Every failure a person can fix is a one-line ``ConfigError``."""
    url = source.settings.url
    nodes, raw = asyncio.run(_read(source, first, until, chunk))
    if raw.error is not None:
        raise ConfigError(f"--prometheus={url}: {raw.error}")
    filled = fill(first, raw.values, hold)
    queries = source.settings.queries
    query = metrics.render(queries.demand.value, source.pool, nodes, queries.scope)
    span = f"between {_rfc3339(first)} and {_rfc3339(until)}"
    if sum(v is not None for v in raw.values) < 2:
        found = "no demand sample" if filled.rps == [] else "only one minute of demand"
        raise ConfigError(
            f"--pool={source.pool}: {found} in {url} {span}; the pool's demand query: {query}"
        )
    path = out / f"trace-{source.pool}.csv"
    write_trace(path, filled.start, filled.rps)
    trace = traces.load(path)
    if trace.start != filled.start or trace.rps != filled.rps:
        raise TraceError(f"{path}: does not read back as the minutes written")
    record = {
        "prometheus": url,
        "pool": source.pool,
        "query": query,
        "sampled": metrics.render(queries.demand.sampled, source.pool, nodes, queries.scope),
        "nodes": nodes,
        "from": _rfc3339(first),
        "to": _rfc3339(until),
        "step_seconds": MINUTE.total_seconds(),
        "chunk_seconds": chunk.total_seconds(),
        "requests": raw.requests,
        "minutes_asked": len(raw.values),
        "minutes_sampled": sum(v is not None for v in raw.values),
        "hold_minutes": hold,
        "gaps": [
            {
                "start": _rfc3339(g.start),
                "end": _rfc3339(g.end),
                "minutes": g.minutes,
                "kind": g.kind,
            }
            for g in filled.gaps
        ],
        "trace": path.name,
    }
    (out / "history.json").write_text(json.dumps(record, indent=2) + "\n")
    return History(trace, path, filled.gaps, raw.requests, nodes)


async def _read(
    source: Source, first: datetime, until: datetime, chunk: timedelta
) -> tuple[list[str], RangeRead]:
    client = metrics.Metrics(source.settings)
    try:
        nodes = source.nodes
        if nodes is None:
            nodes = await _nodes(client, source, first, until)
        demand = source.settings.queries.demand
        read = await read_range(
            client, source.pool, "demand", demand, nodes, first, until, chunk=chunk
        )
        return nodes, read
    finally:
        client.close()


@dataclass(frozen=True)
class RangeRead:
    """A metric of a pool on the grid ``start + i*step`` for ``i < len(values)``.

    ``values[i]`` is the metric's ``value`` expression evaluated at the END of step ``i``, kept
    only when the pool's newest raw sample (its ``sampled`` expression) at that time fell
    inside step ``i``. Otherwise it is ``None``: Prometheus answers an instant query with the
    last sample of the 5 minutes before (its lookback delta), so a series that stopped goes on
    answering for minutes, and those answers are not samples of that step. ``requests`` counts
    the range queries made; ``error`` says why the read stopped, if it did (values then hold
    what was read before it).
    """

    start: datetime
    step: timedelta
    values: list[float | None]
    requests: int = 0
    error: MetricError | None = None


async def read_range(
    client: metrics.Metrics,
    pool: PoolName,
    metric: str,
    q: MetricQuery,
    nodes: Iterable[str],
    start: datetime,
    end: datetime,
    step: timedelta = timedelta(minutes=1),
    chunk: timedelta = ranges.RANGE_CHUNK,
) -> RangeRead:
    """``q`` for ``pool`` over ``[start, end)`` at ``step``, asked for ``chunk`` at a time.

    Prometheus refuses more than 11,000 points per series in one range query; ``chunk`` must
    hold at most ``MAX_POINTS`` steps. Each chunk is two range queries (value, and the newest
    raw sample time, ``max(<sampled>)``), each retried on transient failures as every read of
    the adapter is.
    """
    n = math.floor((end - start) / step)
    per_chunk = math.floor(chunk / step)
    if not 1 <= per_chunk <= metrics.MAX_POINTS:
        raise ValueError(
            f"a chunk of {chunk} is {per_chunk} steps; it must be 1 to {metrics.MAX_POINTS}"
        )
    values: list[float | None] = [None] * max(n, 0)
    names = sorted(set(nodes))
    scope = client.settings.queries.scope
    try:
        value_q = metrics.render(q.value, pool, names, scope)
        sampled_q = f"max({metrics.render(q.sampled, pool, names, scope)})"
    except (ValueError, KeyError) as exc:
        error = MetricError(pool, metric, q.value, f"cannot build the query: {exc}")
        return RangeRead(start, step, values, 0, error)
    requests = 0
    for first in range(0, n, per_chunk):
        last = min(n, first + per_chunk) - 1
        since, until = start + step * (first + 1), start + step * (last + 1)
        got: list[dict[int, float | None]] = []
        for query in (value_q, sampled_q):
            requests += 1
            try:
                result = await client.query_range(query, since, until, step)
            except metrics.QueryFailed as exc:
                error = MetricError(pool, metric, query, exc.reason)
                return RangeRead(start, step, values, requests, error)
            if len(result) > 1:
                why = f"{len(result)} series where one was expected; aggregate it (sum)"
                return RangeRead(
                    start, step, values, requests, MetricError(pool, metric, query, why)
                )
            got.append(ranges.points_by_step(result, start, step, first, last))
        at, sampled = got
        for i, value in at.items():
            newest = sampled.get(i)
            step_start = (start + step * i).timestamp()
            if value is not None and newest is not None and newest > step_start:
                values[i] = value
    return RangeRead(start, step, values, requests)


async def _nodes(
    client: metrics.Metrics, source: Source, first: datetime, until: datetime
) -> list[str]:
    """The pool's nodes, when its queries name them; none needed otherwise."""
    queries = source.settings.queries
    used = {
        name
        for text in (queries.demand.value, queries.demand.sampled)
        for name in string.Template(text).get_identifiers()
    }
    if not used & {"scope", "nodes"}:
        return []
    found = await ranges.labelled_nodes(client, source.node_selector, first, until)
    if isinstance(found, str):
        raise ConfigError(f"--prometheus={source.settings.url}: {found}")
    if not found:
        selector = ",".join(f"{k}={v}" for k, v in sorted(source.node_selector.items()))
        raise ConfigError(
            f"--pool={source.pool}: its demand query is scoped to its nodes ($scope) and "
            f"kube_node_labels shows no node labelled {selector} between {_rfc3339(first)} and "
            f"{_rfc3339(until)}; name them with --nodes"
        )
    return found


def summary(history: History) -> list[str]:
    """What was read, one line, and a line per gap."""
    trace = history.trace
    lines = [
        f"read {trace.minutes} minutes of demand ({_rfc3339(trace.start)} to "
        f"{_rfc3339(trace.end)}) in {history.requests} range queries; "
        f"trace written to {history.path}"
    ]
    lines += [gap.line() for gap in history.gaps]
    return lines


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
