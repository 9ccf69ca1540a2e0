"""The error budgets' count: the minutes in which a pool's requests queue beyond its limit while
nodes are away on loan, each counted once, as a metric and a ``cost`` record in the audit log.

Where it sits: ``runtime.reconcile.Reconciler`` restores the count from the audit log at
start-up (``restore``), hands each pool's budget to the snapshot it observes (``budget``), and
counts the tick's minute after deciding, before the tick's intents are written (``count``).
Kept apart because the count is state the leader carries from tick to tick, and a new leader
takes it up from the audit log: a concern of its own, not a verb of the step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from rebalancer import errors
from rebalancer.core import audit, model
from rebalancer.core.audit import Context
from rebalancer.core.model import PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.core.tick import nodes_lending_costs
from rebalancer.runtime.report import Tally
from rebalancer.runtime.seams import AuditTrail, PoolConfig

log = logging.getLogger(__name__)

MINUTE = timedelta(minutes=1)


class Budgets:
    """The minutes that cost each pool, within its error budget's window (the last one only for
    a pool without a budget)."""

    def __init__(self, pools: Sequence[PoolConfig], keys: Keys, tally: Tally) -> None:
        self.pools, self.keys, self.tally = tuple(pools), keys, tally
        self._cost_minutes: dict[PoolName, list[datetime]] = {}

    async def restore(self, trail: AuditTrail, now: datetime) -> None:
        """Every pool's minutes as the audit log holds them (start-up: a new leader, or this
        one restarted, takes up the count where the last one left it). Raises if the store
        fails."""
        for config in self.pools:
            since = now - (config.slo.window if config.slo else MINUTE)
            self._cost_minutes[config.name] = list(await trail.cost_minutes(config.name, since))

    async def restore_unknown(self, trail: AuditTrail, now: datetime) -> None:
        """The minutes of each pool with an error budget whose count is not known yet (a
        process that only explains, and never started up)."""
        for config in self.pools:
            if config.slo is not None and config.name not in self._cost_minutes:
                since = now - config.slo.window
                self._cost_minutes[config.name] = list(await trail.cost_minutes(config.name, since))

    def budget(self, pool: PoolConfig, now: datetime) -> model.ErrorBudget | None:
        """The pool's error budget at ``now``; None for a pool without one."""
        return pool.slo.budget(self._cost_minutes.get(pool.name, ()), now) if pool.slo else None

    def note(self, now: datetime) -> None:
        """Each budget as it stands at ``now``, for the gauges."""
        self.tally.budgets = {
            str(p.name): p.slo.budget(self._cost_minutes.get(p.name, ()), now)
            for p in self.pools
            if p.slo is not None
        }

    async def count(
        self,
        snapshot: model.Snapshot,
        trail: AuditTrail,
        context: Callable[[PoolConfig], Context],
    ) -> None:
        """Count each minute in which a pool's requests queue beyond its limit while nodes are
        away on loan (``core.tick.nodes_lending_costs``): what lending cost, once per minute
        however many ticks see it, as a metric and a ``cost`` record. Only the leader counts, so
        replicas never count a minute twice, and a new leader (or this one restarted) takes up
        the count from the audit log (``restore``). A record the store fails to take is logged
        and the minute still counts: the measurement is true, and the tick's intents meet the
        same store."""
        minute = snapshot.now.replace(second=0, microsecond=0)
        records = []
        for pool in self.pools:
            seen = snapshot.pools.get(pool.name)
            spent = self._cost_minutes.setdefault(pool.name, [])
            if seen is None or minute in spent:
                continue
            away = nodes_lending_costs(seen, pool.policy, self.keys, snapshot.now)
            if not away:
                continue
            keep = pool.slo.window if pool.slo else MINUTE
            spent[:] = [m for m in spent if m > minute - keep] + [minute]
            self.tally.borrowing_minutes.append(str(pool.name))
            budget = pool.slo.budget(spent, minute) if pool.slo else None
            records.append(
                audit.cost_record(
                    context(pool),
                    trail.new_id,
                    minute,
                    seen,
                    str(pool.name),
                    pool.policy,
                    away,
                    budget,
                )
            )
        if not records:
            return
        try:
            await trail.tick(records)
        except errors.StoreFailed as exc:
            log.error("audit store fails (%s); %d cost minute(s) not recorded", exc, len(records))
            self.tally.audit_failures.append("cost")
        except Exception:  # the tick's own records go on: a budget's minute is not worth them
            log.exception("%d cost minute(s) not recorded: a bug, not the store", len(records))
