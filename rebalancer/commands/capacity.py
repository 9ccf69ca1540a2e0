"""``rebalancer capacity``: what one node of a pool serves when full, from the pool's own history.

Where it sits: the command line parses the flags and calls ``command``; ``measure`` reads the
pool's nodes step by step through the range reads (``adapters.ranges.read_by_node``, the pool's
``node_served`` and ``node_saturated`` templates in its unit) and hands the readings to
``core.capacity.measure``, which decides what they say. It reads Prometheus only, nothing of
the cluster, and writes nothing. How it measures, and what it cannot know: docs/capacity.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from rebalancer import errors, settings
from rebalancer.adapters import metrics, ranges
from rebalancer.core import capacity
from rebalancer.core.model import NodeName, PoolName
from rebalancer.errors import ConfigError
from rebalancer.runtime import adapterconfig, http

EXIT_MEASURED = 0
EXIT_LOWER_BOUND = 1  # no node was full: only a lower bound could be given
_LONGEST = timedelta(days=400)


@dataclass(frozen=True)
class Span:
    start: datetime
    end: datetime
    step: timedelta


async def measure(
    config: settings.Settings,
    pool: settings.PoolSettings,
    span: Span,
    *,
    quantile: float = capacity.QUANTILE,
    nodes: Sequence[str] | None = None,
    reader: metrics.Metrics | None = None,
) -> capacity.Measurement:
    """The pool's per-node capacity over ``span``; its nodes are ``nodes``, else those
    kube-state-metrics showed with the pool's labels. A failed read is a ``ConfigError``
    naming Prometheus and the reason."""
    templates = pool.metrics.node_queries(pool.unit)
    if isinstance(templates, str):
        raise ConfigError(f"pool {pool.name!r}: {templates}")
    served_q, full_q = templates
    m = reader or metrics.Metrics(adapterconfig.metrics_settings(config, pool))
    try:
        names = list(nodes) if nodes is not None else await _nodes(m, pool, span)
        name = PoolName(pool.name)
        served, full = await asyncio.gather(
            ranges.read_by_node(m, name, "node_served", served_q, names, *_grid(span)),
            ranges.read_by_node(m, name, "node_saturated", full_q, names, *_grid(span)),
        )
    finally:
        if reader is None:
            m.close()
    for read in (served, full):
        if read.error is not None:
            raise ConfigError(f"prometheus.url={m.settings.url!r}: {read.error}")
    return capacity.measure(
        {NodeName(n): v for n, v in served.values.items()},
        {NodeName(n): v for n, v in full.values.items()},
        pool.unit,
        span.step,
        quantile,
    )


def _grid(span: Span) -> tuple[datetime, datetime, timedelta]:
    return span.start, span.end, span.step


async def _nodes(m: metrics.Metrics, pool: settings.PoolSettings, span: Span) -> list[str]:
    found = await ranges.labelled_nodes(m, pool.node_selector, span.start, span.end)
    if isinstance(found, str):
        raise ConfigError(f"prometheus.url={m.settings.url!r}: {found}")
    if not found:
        labels = ",".join(f"{k}={v}" for k, v in sorted(pool.node_selector.items()))
        raise ConfigError(
            f"pool {pool.name!r}: no node with the labels {labels} in kube_node_labels over "
            "the span (kube-state-metrics exports only the labels it is allowed to: "
            "--metric-labels-allowlist); name the nodes with --nodes"
        )
    return found


# ---------------------------------------------------------------------------------------------
# The command


def command(args: argparse.Namespace) -> int:
    """``rebalancer capacity``'s handler: the flags checked, the measurement made and shown."""
    config = settings.load(settings.config_path(args.config))
    try:
        pool = config.pool(args.pool)
    except KeyError:
        known = ", ".join(p.name for p in config.pools) or "none in the settings"
        raise ConfigError(
            f"--pool={args.pool}: no configured pool has that name ({known})"
        ) from None
    span = parse_span(args.since, args.until, args.step, datetime.now(UTC))
    if not 0 < args.quantile <= 1:
        raise ConfigError(f"--quantile={args.quantile}: must be above 0 and at most 1")
    nodes = None
    if args.nodes is not None:
        nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
        if not nodes:
            raise ConfigError(f"--nodes={args.nodes!r}: write node names separated by commas")
    found = asyncio.run(measure(config, pool, span, quantile=args.quantile, nodes=nodes))
    if args.output == "json":
        print(json.dumps(doc(pool, span, found), indent=2))
    elif args.output == "yaml":
        import yaml

        print(yaml.safe_dump(doc(pool, span, found), sort_keys=False), end="")
    else:
        print("\n".join(lines(pool, span, found)))
    return EXIT_MEASURED if found.per_node is not None else EXIT_LOWER_BOUND


def parse_span(since: str, until: str | None, step: str, now: datetime) -> Span:
    """The flags' span: ``--since`` and ``--until`` as ``GET /api/v1/decisions`` reads its
    times (RFC 3339, or a time ago: 7d, 36h), ``--step`` a duration of whole seconds."""
    try:
        start = http.parse_time("since", since, now)
        end = now if until is None else http.parse_time("until", until, now)
    except http.BadParameter as exc:
        raise ConfigError(f"--{exc.parameter}={errors.shown(exc.value)}: {exc.message}") from None
    grid = settings.flag_duration("--step", step)
    if grid.total_seconds() != int(grid.total_seconds()):
        raise ConfigError(f"--step={errors.shown(step)}: must be a whole number of seconds")
    if end - start < 2 * grid:
        raise ConfigError(f"--since={since!r}: must be at least two steps ({grid}) before --until")
    if end - start > _LONGEST:
        raise ConfigError(f"--since={since!r}: must be at most {_LONGEST.days}d before --until")
    return Span(start, end, grid)


def lines(pool: settings.PoolSettings, span: Span, m: capacity.Measurement) -> list[str]:
    symbol = m.unit.symbol
    out = [
        f"pool {pool.name}: {m.unit.value}, {_time(span.start)} to {_time(span.end)} in "
        f"{_span(span.step)} steps, {len(m.nodes)} node{'' if len(m.nodes) == 1 else 's'}"
    ]
    if m.per_node is not None:
        out.append(
            f"  capacity per node: {m.per_node:.4g} {symbol} (the {m.quantile:g} quantile of "
            f"{m.full} node-steps full all through, of {m.steps} read)"
        )
        suggested = m.suggested if m.suggested is not None else m.per_node
        whose = "" if m.spread is None else "the weakest node's; "
        out.append(
            f"  write: capacity: {{unit: {m.unit.value}, per_node: {suggested:.4g}}} "
            f"({whose}the settings have {pool.per_node:g} {pool.unit.symbol})"
        )
    else:
        most = "no reading at all" if m.lower_bound is None else f"{m.lower_bound:.4g} {symbol}"
        out.append(f"  capacity per node: at least {most}: no node was full, a lower bound only")
    for n in m.nodes:
        when_full = (
            f"{n.per_node:.4g} {symbol} when full" if n.per_node is not None else "never full"
        )
        at_most = "" if n.most is None else f", at most {n.most:.4g}"
        out.append(f"  {n.node}: full {n.full} of {n.steps} steps, {when_full}{at_most}")
    out += [f"  limit: {said}" for said in m.limits()]
    return out


def doc(pool: settings.PoolSettings, span: Span, m: capacity.Measurement) -> dict[str, Any]:
    return {
        "pool": pool.name,
        "unit": m.unit.value,
        "from": _time(span.start),
        "to": _time(span.end),
        "step_seconds": span.step.total_seconds(),
        "quantile": m.quantile,
        "per_node": m.per_node,
        "suggested": m.suggested,
        "lower_bound": m.lower_bound,
        "full_steps": m.full,
        "steps": m.steps,
        "configured": {"unit": pool.unit.value, "per_node": pool.per_node},
        "nodes": [
            {
                "node": n.node,
                "steps": n.steps,
                "full_steps": n.full,
                "per_node": n.per_node,
                "most": n.most,
            }
            for n in m.nodes
        ],
        "limits": m.limits(),
    }


def _time(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _span(step: timedelta) -> str:
    seconds = int(step.total_seconds())
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"
