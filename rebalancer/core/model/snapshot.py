"""The snapshot a tick decides from: every pool as the cluster, the metrics, the alerts and the
clocks showed it at ``now``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from rebalancer.core import clocks as clocks_module
from rebalancer.core.model.budget import Cover, ErrorBudget
from rebalancer.core.model.cluster import NodeView, PendingPod
from rebalancer.core.model.demand import DemandHistory, Sample
from rebalancer.core.model.names import NodeName, PoolName


@dataclass(frozen=True, slots=True)
class DropHeld:
    """A fall of demand too fast to be believed yet (``core.demand``): the planner plans with
    the level before it and lends nothing until it persists or recovers."""

    level: Sample  # the last believed sample, before the fall
    seen: Sample  # the newest sample, the one not believed
    since: datetime  # when the fall was first seen


@dataclass(frozen=True, slots=True)
class FiringAlert:
    """An Alertmanager alert that fires and matched one of the pool's ``wake_on`` selectors:
    inference is short, as the alert's rule sees it (docs/design/alertmanager.md). It counts
    as pressure until ``until``: its own ``endsAt`` when the notification gave one, else the
    last firing notification plus the configured maximum age (a lost ``resolved`` cannot hold
    a pool for ever), and never past its ``starts_at`` plus the maximum life (a notification
    posted again cannot hold it longer)."""

    name: str  # the alert's ``alertname`` label
    fingerprint: str  # Alertmanager's identity of the alert (its label set)
    starts_at: datetime
    matcher: str  # the selector that matched, in Alertmanager's syntax
    received: datetime  # the last firing notification of it
    until: datetime


@dataclass(frozen=True)
class PoolSnapshot:
    """One pool at ``Snapshot.now``.

    ``demand`` is the sample to plan with: the newest one that was believed, with the time it
    was sampled. When this tick's read gave nothing usable (Prometheus unreachable, an empty
    result, NaN) ``demand_known`` is False and ``demand`` is the last good sample, so demand is
    unknown since that sample; with no sample at all it is unknown since ``unknown_since``
    (the controller's start). ``held`` is set while an implausibly fast fall is not believed.
    """

    nodes: tuple[NodeView, ...]
    demand: Sample | None = None
    queue: Sample | None = None
    history: DemandHistory | None = None
    demand_known: bool = True
    unknown_since: datetime | None = None
    held: DropHeld | None = None
    # The pool's error budget, counted up to now, where it has an ``slo``: one that cannot
    # cover another loan's worst case stops lending (``core.planning``), and strategies are
    # shown it (``PoolView.budget``).
    budget: ErrorBudget | None = None
    # What the pool's history covers (``core.exposure``), where it has an ``slo``: once the
    # budget cannot pay for another loan, only covered loans stay (``core.planning``).
    cover: Cover | None = None
    # Pending pods that tolerate the pool's lend taints: who would use a lent node. A pool
    # that lends only to takers (``PoolPolicy.lend_only_to_takers``) lends none without one.
    takers: tuple[PendingPod, ...] = ()
    # Alertmanager alerts that fire and match the pool's ``wake_on``: the pool lends nothing
    # while one holds, and the planner takes nodes back as it does for a queue.
    alerts: tuple[FiringAlert, ...] = ()
    # Nodes of ``nodes`` no pool selects that carry our keys: the pool adopted them to finish
    # them (``runtime.reconcile``); each is taken back from its own original.
    orphans: frozenset[NodeName] = frozenset()
    # Nodes of ``nodes`` other pools select too, with those pools: this pool drives them.
    overlaps: Mapping[NodeName, tuple[PoolName, ...]] = field(default_factory=dict)
    # The clocks as this tick measured them (``core.clocks``): sample ages are judged on
    # Prometheus' clock, and nothing is lent while one is past the bound or unmeasured.
    clocks: clocks_module.Clocks = clocks_module.NONE


@dataclass(frozen=True)
class Snapshot:
    """Everything one tick decides from. ``now`` is an argument, never read from a clock."""

    now: datetime
    pools: Mapping[PoolName, PoolSnapshot]
    paused: bool = False  # the global pause: no lending, safety reclaims still happen
    frozen: bool = False  # the global freeze: nothing moves at all
