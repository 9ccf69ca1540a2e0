"""``rebalancer check``: is a settings file ready to deploy, and, online, to this cluster?

Offline (no cluster, no Prometheus): the settings load (every problem the loader finds, one
line each), at least one pool is named, and every PromQL template, filled in as the controller
fills it in, parses with a real PromQL parser (``promql-parser``, the Prometheus grammar); a
query with an unbalanced parenthesis would otherwise fail on every tick, never at start.

Online (``--online``): what ``explain`` reads, read once. Per pool: how many nodes its selector
finds (none, or a node two pools select, is a problem); whether its serving nodes carry its
serving taints (a node without them takes other pods while it serves, and a lend that removes
them removes nothing); whether any pending pod tolerates its lent taints (with
``lend_only_to_takers``, none means nothing is lent); each query asked of Prometheus as the
loop asks it (a refusal, no sample within the lookback; the history query over the last hour);
and what the first tick would do.

Every finding is one line, ``LEVEL FIELD: MESSAGE``: ``fail`` stops ``check`` with exit 1,
``warn`` and ``ok`` do not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import promql_parser

from rebalancer.adapters import metrics
from rebalancer.core import model, nodestate
from rebalancer.runtime import adapterconfig

if TYPE_CHECKING:
    from rebalancer.runtime.wiring import Controller
    from rebalancer.settings import PoolSettings, Settings


class Level(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    field: str  # the settings path it is about, e.g. pools[0].metrics.queue.value
    message: str

    def __str__(self) -> str:
        return f"{self.level.value:<4} {self.field}: {self.message}"

    def doc(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


# What the templates are filled in with offline: the shape matters to the parser, not the names.
_SAMPLE_NODES = ("node-a", "node-b")
_SAMPLE_WINDOW = "300s"
_HISTORY_CHECKED = timedelta(hours=1)  # how far back --online reads the history query


def offline(config: Settings) -> list[Finding]:
    """What can be known from the file alone (the settings already loaded)."""
    if not config.pools:
        return [
            Finding(
                Level.FAIL,
                "pools",
                "none: the controller would have nothing to watch and refuses to start",
            )
        ]
    found: list[Finding] = []
    for i, pool in enumerate(config.pools):
        bad = [f for f in _promql(pool, f"pools[{i}].metrics") if f.level is Level.FAIL]
        found += bad or [Finding(Level.OK, f"pools[{i}]", f"{pool.name}: every query parses")]
    return found


def _promql(pool: PoolSettings, where: str) -> Iterator[Finding]:
    scope = pool.metrics.scope
    for field, template, extra in _templates(pool):
        try:
            query = metrics.render(template, pool.name, _SAMPLE_NODES, scope, **extra)
            promql_parser.parse(query)
        except (ValueError, KeyError) as exc:  # the parser's; a placeholder not filled in
            yield Finding(Level.FAIL, f"{where}.{field}", f"not PromQL: {exc}")


def _templates(pool: PoolSettings) -> Iterator[tuple[str, str, dict[str, str]]]:
    """Every query the controller and ``rebalancer capacity`` would run for ``pool``: its
    preset's in its unit, or what the settings write out instead."""
    q = adapterconfig.queries(pool)
    for name in ("demand", "queue", "running", "gpu_busy"):
        query = getattr(q, name)
        if query is not None:
            yield f"{name}.value", query.value, {}
            yield f"{name}.sampled", query.sampled, {}
    yield "history", q.history, {"window": _SAMPLE_WINDOW}
    node = pool.metrics.node_queries(pool.unit)
    if not isinstance(node, str):  # a reason there is none: capacity says it when asked
        yield "node_served", node[0], {"window": _SAMPLE_WINDOW}
        yield "node_saturated", node[1], {"window": _SAMPLE_WINDOW}


async def online(config: Settings, controller: Controller) -> list[Finding]:
    """The pools as this cluster and its Prometheus see them (the controller's informer synced),
    and the first tick's plan."""
    snapshot, decision = await controller.reconciler.preview()
    keys = controller.keys
    found: list[Finding] = []
    selected: dict[str, list[str]] = {}
    for i, pool in enumerate(config.pools):
        seen = snapshot.pools.get(model.PoolName(pool.name))
        nodes = seen.nodes if seen is not None else ()
        for seen_node in nodes:
            selected.setdefault(seen_node.name, []).append(pool.name)
        found += _selection(i, pool, nodes, keys)
        if nodes and seen is not None:
            found += _takers(i, pool, seen, keys)
            found += await _queries(i, pool, nodes, controller.metrics)
            plan = decision.plan.pools.get(model.PoolName(pool.name))
            summary = plan.summary if plan is not None else "no plan (see rebalancer explain)"
            found.append(Finding(Level.OK, f"pools[{i}]", f"{pool.name}: first tick: {summary}"))
    for name, pools in sorted(selected.items()):
        if len(pools) > 1:
            message = f"selected by {len(pools)} pools ({', '.join(pools)}); one pool each"
            found.append(Finding(Level.FAIL, f"node {name}", message))
    return found


def _selection(
    i: int, pool: PoolSettings, nodes: Iterable[model.NodeView], keys: nodestate.Keys
) -> list[Finding]:
    nodes = list(nodes)
    where = f"pools[{i}].node_selector"
    selector = ",".join(f"{k}={v}" for k, v in pool.node_selector.items())
    if not nodes:
        return [Finding(Level.FAIL, where, f"{pool.name}: {selector} selects no node")]
    serving = [n for n in nodes if n.labels.get(keys.state) is None]
    wanted = [t.taint() for t in pool.serving_taints]
    bare = sorted(n.name for n in serving if not all(t in n.taints for t in wanted))
    found = [
        Finding(
            Level.OK,
            where,
            f"{pool.name}: {len(nodes)} nodes, {len(serving)} serving, "
            f"{len(nodes) - len(serving)} lent or in flight",
        )
    ]
    if bare:
        shown = ", ".join(str(t) for t in wanted)
        found.append(
            Finding(
                Level.WARN,
                f"pools[{i}].serving_taints",
                f"{pool.name}: {len(bare)} of {len(serving)} serving nodes lack {shown} "
                f"({_few(bare)}); while they serve, other pods may land on them",
            )
        )
    return found


def _takers(
    i: int, pool: PoolSettings, seen: model.PoolSnapshot, keys: nodestate.Keys
) -> list[Finding]:
    where = f"pools[{i}].lent_taints"
    shown = ", ".join(str(t) for t in pool.lend_spec(keys).add_taints)
    if seen.takers:
        names = [f"{p.namespace}/{p.name}" for p in seen.takers]
        return [
            Finding(Level.OK, where, f"{pool.name}: pending pods tolerate {shown}: {_few(names)}")
        ]
    if pool.lend_only_to_takers:
        why = "with lend_only_to_takers the pool lends nothing until one does"
        return [Finding(Level.WARN, where, f"{pool.name}: no pending pod tolerates {shown}; {why}")]
    return [Finding(Level.OK, where, f"{pool.name}: no pending pod tolerates {shown} now")]


async def _queries(
    i: int, pool: PoolSettings, nodes: Iterable[model.NodeView], source: Any
) -> list[Finding]:
    """The pool's queries asked as the loop asks them (``MetricsSource.read``)."""
    where = f"pools[{i}].metrics"
    name, names = model.PoolName(pool.name), [n.name for n in nodes]
    read = await source.read(name, names)
    found = [Finding(Level.FAIL, f"{where}.{e.metric}", e.reason) for e in read.errors]
    failed = {e.metric for e in read.errors}
    if read.demand is None and "demand" not in failed:
        why = "no sample within prometheus.lookback: demand unknown, nothing would be lent"
        found.append(Finding(Level.FAIL, f"{where}.demand", why))
    if read.queue is None and "queue" not in failed:
        found.append(Finding(Level.WARN, f"{where}.queue", "no sample: the queue is not watched"))
    # The history query too (strategies and the error budget's cover read it): the last hour.
    until = read.demand.at if read.demand is not None else datetime.now(UTC)
    past = await source.history(name, names, until - _HISTORY_CHECKED, until, timedelta(minutes=5))
    if past.error is not None:
        found.append(Finding(Level.FAIL, f"{where}.history", past.error.reason))
    elif not any(v is not None for v in past.history.values):
        why = "no value in the last hour: strategies and the error budget would see a gap"
        found.append(Finding(Level.WARN, f"{where}.history", why))
    if not found:
        demand, queue = read.demand, read.queue
        assert demand is not None
        assert queue is not None
        found.append(
            Finding(
                Level.OK,
                where,
                f"{pool.name}: demand {demand.value:g} {pool.unit.symbol} "
                f"at {demand.at:%H:%M:%S}Z, queue {queue.value:g}",
            )
        )
    return found


def _few(names: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"
