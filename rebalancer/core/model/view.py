"""What a strategy sees of one pool (``PoolView``), the planner's rules it will meet
(``Limits``), and the nodes a demand needs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from rebalancer.core.model.budget import ErrorBudget
from rebalancer.core.model.demand import DemandHistory, Sample, Unit
from rebalancer.core.model.names import PoolName


@dataclass(frozen=True, slots=True)
class Limits:
    """The planner's churn and metrics rules a strategy's proposal will meet (``PoolPolicy``'s
    values), for a strategy that models what the planner will make of it."""

    cooldown: timedelta = timedelta(minutes=15)  # a returned node is not lent again sooner
    max_step_fraction: float = 0.25  # strategy lends and reclaims per tick, as a pool share
    drain: timedelta = timedelta(minutes=2)  # borrowed pods' deadline on a reclaim
    metrics_grace: timedelta = timedelta(minutes=7)  # demand unknown this long: reclaim all
    drop_floor: float = 1 / 3  # a fall below this share of the level is held ...
    drop_hold: timedelta = timedelta(minutes=10)  # ... this long before it is believed


@dataclass(frozen=True)
class PoolView:
    """What a strategy sees of one pool at ``now``."""

    name: PoolName
    now: datetime
    size: int  # every node of the pool, whatever its state
    lent: int  # nodes lent or being lent
    demand: Sample | None  # in ``unit``
    queue: Sample | None  # requests waiting
    history: DemandHistory
    # What one warm node serves at the latency target, in ``unit`` (named from when demand was
    # always requests per second).
    rps_per_node: float
    min_serving: int
    headroom: float
    # from a strategy's reclaim decision until the node serves warm again: notice, drain, warm-up
    return_time: timedelta
    zone: str  # the pool's time zone, for strategies that think in local hours
    # The pool's error budget where it has an ``slo`` (the controller counts it, and keeps the
    # count in the audit log; ``rebalancer simulate --slo``); None: no budget, fixed margins.
    budget: ErrorBudget | None = None
    limits: Limits = Limits()
    unit: Unit = Unit.REQUESTS_PER_SECOND  # what demand and ``rps_per_node`` are counted in

    def need(self, rps: float) -> int:
        """Nodes that must serve ``rps`` with headroom, never fewer than the minimum."""
        return nodes_needed(rps, self.rps_per_node, self.headroom, self.min_serving)


def nodes_needed(rps: float, rps_per_node: float, headroom: float, min_serving: int) -> int:
    raw = rps * (1.0 + headroom) / rps_per_node
    if not raw < MAX_NODES:  # an absurd rate (or an overflow) needs more than any pool has
        return max(min_serving, MAX_NODES)
    # A hair of tolerance so that 14.4000000001 from float noise is not a 15th node.
    return max(min_serving, math.ceil(raw - 1e-9))


MAX_NODES = 10**9  # more nodes than any pool holds: what an absurd demand "needs"
