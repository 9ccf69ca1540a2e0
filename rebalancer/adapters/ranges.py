"""Reads of a pool over a span of history, step by step, in range queries a day at a time: its
nodes one by one and the nodes a label picked (``rebalancer capacity``; the simulator reads a
pool's past demand on the same grid, ``sandbox/sim/history.py``). Apart from ``Metrics``, whose
tick reads last samples."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rebalancer.adapters.metrics import (
    MAX_POINTS,
    Metrics,
    QueryFailed,
    finite_value,
    promql_duration,
    render,
)
from rebalancer.core.model import MetricError, PoolName

RANGE_CHUNK = timedelta(days=1)  # one request's span: 1,440 points at one-minute steps


def points_by_step(
    result: list[dict[str, Any]], start: datetime, step: timedelta, first: int, last: int
) -> dict[int, float | None]:
    """A range result's points by step index (a point at ``start + (i+1)*step`` is step ``i``)."""
    points: dict[int, float | None] = {}
    for ts, raw in result[0]["values"] if result else []:
        i = round((float(ts) - start.timestamp()) / step.total_seconds()) - 1
        if first <= i <= last:
            points[i] = finite_value(raw)
    return points


@dataclass(frozen=True)
class NodesRead:
    """A per-node template of a pool on the grid ``start + i*step``, node by node.

    ``values[node][i]`` is the template evaluated at the END of step ``i`` with ``$window`` =
    ``step``: the node's figure over that step (``None``: no series for the node then). A
    node that never had a series is absent. ``requests`` counts the range queries made;
    ``error`` says why the read stopped, if it did (values then hold what was read before).
    """

    start: datetime
    step: timedelta
    values: Mapping[str, list[float | None]]
    requests: int = 0
    error: MetricError | None = None


async def read_by_node(
    metrics: Metrics,
    pool: PoolName,
    metric: str,
    template: str,
    nodes: Iterable[str],
    start: datetime,
    end: datetime,
    step: timedelta = timedelta(minutes=1),
    chunk: timedelta = RANGE_CHUNK,
) -> NodesRead:
    """``template`` (one series per ``node`` label, ``$window`` the step) for ``pool``'s
    ``nodes`` over ``[start, end)``, asked for ``chunk`` at a time (``rebalancer capacity``).

    One range query per chunk, retried on transient failures as every read of the adapter
    is; ``chunk`` must hold at most ``MAX_POINTS`` steps."""
    n = math.floor((end - start) / step)
    per_chunk = math.floor(chunk / step)
    if not 1 <= per_chunk <= MAX_POINTS:
        raise ValueError(f"a chunk of {chunk} is {per_chunk} steps; it must be 1 to {MAX_POINTS}")
    values: dict[str, list[float | None]] = {}
    try:
        query = render(
            template,
            pool,
            sorted(set(nodes)),
            metrics.settings.queries.scope,
            window=promql_duration(step),
        )
    except (ValueError, KeyError) as exc:
        error = MetricError(pool, metric, template, f"cannot build the query: {exc}")
        return NodesRead(start, step, values, 0, error)
    requests = 0
    for first in range(0, n, per_chunk):
        last = min(n, first + per_chunk) - 1
        requests += 1
        try:
            result = await metrics.query_range(
                query, start + step * (first + 1), start + step * (last + 1), step
            )
        except QueryFailed as exc:
            return NodesRead(
                start, step, values, requests, MetricError(pool, metric, query, exc.reason)
            )
        for series in result:
            node = str(series["metric"].get("node", ""))
            if not node:
                why = "a series without a node label; aggregate it by (node)"
                return NodesRead(
                    start, step, values, requests, MetricError(pool, metric, query, why)
                )
            points = points_by_step([series], start, step, first, last)
            row = values.setdefault(node, [None] * n)
            for i, value in points.items():
                row[i] = value
    return NodesRead(start, step, values, requests)


async def labelled_nodes(
    metrics: Metrics, selector: Mapping[str, str], start: datetime, end: datetime
) -> list[str] | str:
    """The nodes kube-state-metrics showed with all of ``selector``'s labels in ``[start, end]``.

    kube-state-metrics exports a node label ``k`` as ``label_<k with every character outside
    [a-zA-Z0-9_] as _>`` on ``kube_node_labels``, and only the labels it is allowed to
    (``--metric-labels-allowlist``): an empty list may mean the label is not exported. Returns
    the sorted names, or the reason the query failed.
    """
    matchers = ",".join(
        f'label_{re.sub(r"[^a-zA-Z0-9_]", "_", key)}="{_promql_string(value)}"'
        for key, value in sorted(selector.items())
    )
    span = promql_duration(max(end - start, timedelta(seconds=1)))
    query = f"group by (node) (last_over_time(kube_node_labels{{{matchers}}}[{span}]))"
    try:
        result = await metrics.query_instant(query, end)
    except QueryFailed as exc:
        return f"{exc.reason} (query: {query})"
    return sorted({str(s["metric"]["node"]) for s in result if s["metric"].get("node")})


def _promql_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
