"""The error budgets' count: the minutes in which a pool's requests queue beyond its limit while
nodes are away on loan, each counted once, as a metric and a ``cost`` record in the audit log.

Where it sits: ``runtime.step`` counts the tick's minute (``count``) and the reconciler hands
each pool's budget (``budget``) to the snapshot it observes; start-up restores the count from
the audit log (``runtime.recovering.restore_costs``). The count is the leader's memory
(``Memory.costs``): a new leader takes it up from the audit log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from rebalancer.core import audit, model
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.model import PoolName
from rebalancer.core.tick import nodes_lending_costs
from rebalancer.runtime.effects import Rules
from rebalancer.runtime.memory import Memory
from rebalancer.runtime.seams import PoolConfig

MINUTE = timedelta(minutes=1)


def budget(memory: Memory, pool: PoolConfig, now: datetime) -> model.ErrorBudget | None:
    """The pool's error budget at ``now``; None for a pool without one."""
    return pool.slo.budget(memory.costs.get(pool.name, ()), now) if pool.slo else None


def gauges(
    memory: Memory, pools: Sequence[PoolConfig], now: datetime
) -> dict[str, model.ErrorBudget]:
    """Each budget as it stands at ``now``, for the gauges."""
    return {
        str(p.name): p.slo.budget(memory.costs.get(p.name, ()), now)
        for p in pools
        if p.slo is not None
    }


def count(
    costs: Mapping[PoolName, tuple[datetime, ...]],
    snapshot: model.Snapshot,
    rules: Rules,
    context: Callable[[PoolConfig], Context],
    new_id: audit.NewId,
) -> tuple[dict[PoolName, tuple[datetime, ...]], tuple[AuditRecord, ...], tuple[str, ...]]:
    """Count each minute in which a pool's requests queue beyond its limit while nodes are
    away on loan (``core.tick.nodes_lending_costs``): what lending cost, once per minute
    however many ticks see it, as a metric and a ``cost`` record. Only the leader counts, so
    replicas never count a minute twice, and a new leader takes up the count from the audit
    log. A record the store fails to take is logged and the minute still counts: the
    measurement is true. The minutes after, the records, and the pools that paid a minute."""
    minute = snapshot.now.replace(second=0, microsecond=0)
    out = dict(costs)
    records: list[AuditRecord] = []
    paid: list[str] = []
    for pool in rules.pools:
        seen = snapshot.pools.get(pool.name)
        spent = out.setdefault(pool.name, ())
        if seen is None or minute in spent:
            continue
        away = nodes_lending_costs(seen, pool.policy, rules.keys, snapshot.now)
        if not away:
            continue
        keep = pool.slo.window if pool.slo else MINUTE
        out[pool.name] = (*(m for m in spent if m > minute - keep), minute)
        paid.append(str(pool.name))
        left = pool.slo.budget(out[pool.name], minute) if pool.slo else None
        records.append(
            audit.cost_record(
                context(pool), new_id, minute, seen, str(pool.name), pool.policy, away, left
            )
        )
    return out, tuple(records), tuple(paid)
