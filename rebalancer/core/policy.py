"""The safety limits of one pool: the numbers the planner enforces whatever a strategy says.

Built from validated settings at start-up (or from command-line flags in the simulator). The
defaults are the ones documented in ``docs/design/safety-rules.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property

from rebalancer.core import demand, model, nodestate, windows


def default_lend_spec(keys: nodestate.Keys) -> nodestate.LendSpec:
    """Swap the serving taint for the lent taint training tolerates (docs/design/pools.md)."""
    return nodestate.LendSpec(
        remove_taints=(model.Taint(key="workload", value="inference", effect="NoSchedule"),),
        add_taints=(model.Taint(key=keys.lent_taint, value="training", effect="NoSchedule"),),
    )


class Guard(StrEnum):
    """A safety rule that may be left out of a policy. Every policy the controller builds holds
    them all; only the simulator's baselines run without some, so that their own rule shows
    (``sandbox.sim.engine``). The pause, windows, ``min_serving`` and the rules on which nodes
    may move are not guards: no policy runs without them."""

    METRICS = "metrics"  # a stale or missing demand sample stops lending; lost, reclaims all
    DEMAND_DROP_HOLD = "demand_drop_hold"  # a fall of demand faster than traffic falls is held
    HEADROOM = "headroom"  # lend only what demand, with ``headroom`` on top, leaves serving
    MAX_LENT_FRACTION = "max_lent_fraction"  # never more than that share of the pool lent
    DEMAND_ABOVE_SERVING = "demand_above_serving"  # demand above what serves: reclaim at once
    QUEUE_LIMIT = "queue_limit"  # requests waiting beyond ``queue_limit`` stop lending, reclaim
    ERROR_BUDGET = "error_budget"  # no lending the pool's ``slo`` budget could not pay for


ALL_GUARDS = frozenset(Guard)


@dataclass(frozen=True)
class PoolPolicy:
    # What one warm node serves at the latency target, in ``unit`` (the name is from when
    # demand was always requests per second; the planner's arithmetic is the same in any unit).
    rps_per_node: float
    min_serving: int = 2  # never fewer warm-or-serving nodes than this
    headroom: float = 0.2  # serving must cover demand * (1 + headroom)
    max_lent_fraction: float = 1.0  # never more than this share of the pool lent
    min_loan: timedelta = timedelta(0)  # a strategy may not take a node back sooner
    cooldown: timedelta = timedelta(minutes=15)  # after a node returns, before it is lent again
    max_step_fraction: float = 0.25  # lends (and strategy reclaims) per tick, as pool share
    staleness: timedelta = timedelta(minutes=2)  # older demand samples are unknown
    stale_grace: timedelta = timedelta(minutes=5)  # unknown this long past staleness: reclaim
    queue_limit: float = 0.0  # requests waiting above which nothing more is lent
    queue_reclaims: bool = True  # requests waiting above the limit also take nodes back
    drop_floor: float = 1 / 3  # demand keeps at least this share of its level per minute ...
    drop_hold: timedelta = timedelta(minutes=10)  # ... or the fall is held this long
    # How far ahead the borrowed pods of a reclaim the strategy sees coming are told; safety
    # and operator reclaims give none (docs/design/reclaim-notice.md). The controller's
    # settings give every pool 5 minutes unless told otherwise; none here, as a policy built
    # for a pool without pods (a baseline's) needs none.
    reclaim_notice: timedelta = timedelta(0)
    reclaim_deadline: timedelta = timedelta(minutes=2)  # then borrowed pods are deleted
    warmup: timedelta = timedelta(minutes=5)  # an inference replica's cold start on a returned node
    window: windows.Window = windows.ALWAYS
    zone: str = "UTC"  # the default zone of node window overrides
    lend_spec: nodestate.LendSpec = field(
        default_factory=lambda: default_lend_spec(nodestate.Keys())
    )
    guards: frozenset[Guard] = ALL_GUARDS
    # The strategy lends a node only to a pending job that would run on it (``core.takers``).
    # The controller's settings turn this on for every pool unless told otherwise; the value
    # here is off so that a policy built for a pool without pods (the simulator's) lends.
    lend_only_to_takers: bool = False
    # With it: a loan no job runs on or waits for this long after it began is given back.
    unused_loan: timedelta = timedelta(minutes=5)
    unit: model.Unit = model.Unit.REQUESTS_PER_SECOND  # what demand and capacity are counted in

    def __post_init__(self) -> None:
        problems = []
        if not self.rps_per_node > 0:
            problems.append(
                f"capacity per node must be > 0 {self.unit.symbol}, got {self.rps_per_node}"
            )
        if self.min_serving < 0:
            problems.append(f"min_serving must be >= 0, got {self.min_serving}")
        if self.headroom < 0:
            problems.append(f"headroom must be >= 0, got {self.headroom}")
        if not 0 <= self.max_lent_fraction <= 1:
            problems.append(f"max_lent_fraction must be in [0, 1], got {self.max_lent_fraction}")
        if not 0 < self.max_step_fraction <= 1:
            problems.append(f"max_step_fraction must be in (0, 1], got {self.max_step_fraction}")
        if not 0 <= self.drop_floor <= 1:
            problems.append(f"drop_floor must be in [0, 1], got {self.drop_floor}")
        if problems:
            raise ValueError("; ".join(problems))

    @cached_property
    def drop_rule(self) -> demand.DropRule:
        """How fast this pool's demand may fall before a fall is held (``core.demand``); made
        once per policy (a policy does not change: a new one is a new object), not per tick."""
        return demand.DropRule(
            floor=self.drop_floor, hold=self.drop_hold, rps_per_node=self.rps_per_node
        )

    def step_budget(self, size: int) -> int:
        return max(1, math.ceil(self.max_step_fraction * size))

    @property
    def return_time(self) -> timedelta:
        """From a reclaim decision until the node serves warm: drain, then cold start."""
        return self.reclaim_deadline + self.warmup

    @property
    def lead_time(self) -> timedelta:
        """From a strategy's reclaim decision until the node serves warm: the notice, then the
        return time. What a strategy must look ahead (``PoolView.return_time``)."""
        return self.reclaim_notice + self.return_time

    @property
    def loan_risk_minutes(self) -> int:
        """The most breach minutes a loan can cost when load jumps beyond what serves: the
        minute the jump is seen (a decision reads demand a minute late), then the return time
        of the nodes taken back for it. No notice: a reclaim for demand above serving gives
        none (docs/design/reclaim-notice.md)."""
        return 1 + math.ceil(self.return_time / timedelta(minutes=1))

    def view(
        self,
        name: model.PoolName,
        now: datetime,
        pool: model.PoolSnapshot,
        lent: int,
    ) -> model.PoolView:
        """What a strategy sees of ``pool``: the same numbers the planner will enforce."""
        return model.PoolView(
            name=name,
            now=now,
            size=len(pool.nodes),
            lent=lent,
            demand=pool.demand,
            queue=pool.queue,
            history=pool.history or model.DemandHistory.empty(now),
            rps_per_node=self.rps_per_node,
            min_serving=self.min_serving,
            headroom=self.headroom,
            return_time=self.lead_time,
            zone=self.zone,
            budget=pool.budget,
            unit=self.unit,
            limits=self.limits,
        )

    @cached_property
    def limits(self) -> model.Limits:
        """The limits a strategy's view shows: made once per policy, as ``drop_rule``."""
        return model.Limits(
            cooldown=self.cooldown,
            max_step_fraction=self.max_step_fraction,
            drain=self.reclaim_deadline,
            metrics_grace=self.staleness + self.stale_grace,
            drop_floor=self.drop_floor,
            drop_hold=self.drop_hold,
        )

    def need(self, rps: float) -> int:
        """Nodes ``rps`` needs serving; without the headroom guard, demand is read bare."""
        headroom = self.headroom if Guard.HEADROOM in self.guards else 0.0
        return model.nodes_needed(rps, self.rps_per_node, headroom, self.min_serving)
