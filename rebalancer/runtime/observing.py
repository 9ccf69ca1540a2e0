"""The observe step: each pool's nodes from the informer's cache, its demand and queue samples,
its demand history when it wants one (and what that history covers), the takers and alerts
that bear on it, and the clocks it is read against, as one ``Observation``.

Where it sits: first in ``runtime.reconcile.Reconciler.tick`` (and ``preview``); what the
memory makes of it (each demand through its belief, the budget, what is said once) is
``runtime.perception``'s. A lent node belongs to the pool its *original* labels select
(``nodestate.serving_labels``); a node two pools select goes to the first; a node no pool
selects that carries our keys is an orphan the ``adopter`` pool takes back. Unknown is never
zero: a metrics read that fails is no sample, and the planner fails toward inference. It
remembers nothing between ticks but caches of what it read.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from rebalancer.core import clocks, exposure, model
from rebalancer.core.model import MetricError, NodeName, NodeView, PoolMetrics, PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.runtime.membership import Judge, Membership
from rebalancer.runtime.seams import (
    AlertSource,
    ApiServerClock,
    HistorySettings,
    MetricsSource,
    Observation,
    PoolConfig,
    PrometheusClock,
    ViewSource,
)

log = logging.getLogger(__name__)


class Observer:
    """What the seams show each tick: nodes, samples, histories, takers, alerts and clocks."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        *,
        views: ViewSource,
        metrics: MetricsSource,
        keys: Keys | None = None,
        history: HistorySettings | None = None,
        paused: bool = False,
        frozen: bool = False,
        alerts: AlertSource | None = None,
        apiserver_clock: ApiServerClock | None = None,
        prometheus_clock: PrometheusClock | None = None,
        clock_bound: timedelta = clocks.DEFAULT_BOUND,
    ) -> None:
        self.pools, self.views, self.metrics = tuple(pools), views, metrics
        self.keys, self.history_settings = keys or Keys(), history or HistorySettings()
        self.paused, self.frozen = paused, frozen
        self.alerts = alerts  # None: no Alertmanager receiver, no alert holds a pool
        # The clocks measured each tick (None: not measured, as with in-memory fakes), and the
        # skew past which a pool lends nothing (docs/design/clocks.md).
        self.apiserver_clock, self.prometheus_clock = apiserver_clock, prometheus_clock
        self.clock_bound = clock_bound
        # Caches of what was read, whose loss changes no decision: each pool's demand history
        # by where it ends (read again when ``history_end`` moves on), and what it covers, judged
        # incrementally as each read continues the last.
        self._histories: dict[PoolName, tuple[datetime, model.DemandHistory]] = {}
        self._jumps: dict[PoolName, exposure.Jumps] = {}  # pools with an slo: their covers
        # The pools' membership as last found, judged again only where views changed.
        self._judge = Judge()

    def reconfigure(
        self, pools: Sequence[PoolConfig], *, paused: bool, frozen: bool, clock_bound: timedelta
    ) -> None:
        """New settings from the next observation on (``Reconciler.reconfigure``). The demand
        histories are kept (their queries wait for a restart); what a pool's history covers is
        judged afresh where the shape it is judged by (its capacity, min_serving, loan risk)
        changed."""
        shapes = {p.name: exposure.shape_of(p.policy) for p in pools}
        for pool in self.pools:
            if shapes.get(pool.name) != exposure.shape_of(pool.policy):
                self._jumps.pop(pool.name, None)
        self.pools = tuple(pools)
        self.paused, self.frozen, self.clock_bound = paused, frozen, clock_bound

    def members(self) -> dict[PoolName, tuple[NodeView, ...]]:
        """Each pool's nodes, orphans adopted (``_membership``)."""
        return self._membership().members

    def _membership(self) -> Membership:
        """Each pool's nodes (``membership.judge``): a node two pools select goes to the first,
        and is reported to it (``PoolSnapshot.overlaps``: a finding and an Event on the node,
        once per pair of pools). A node no pool selects that carries our keys (GPU Feature
        Discovery relabelled a lent node out of every selector) is an orphan: the pool
        ``adopter`` names takes it as a member to finish it (``PoolSnapshot.orphans``), and it
        is logged once. Judged again only for the nodes whose views changed since the last
        tick (``membership.Judge``)."""
        every = {pool.name: self.views.node_views(pool.marks) for pool in self.pools}
        return self._judge.membership(self.pools, self.keys, every)

    async def observe(
        self,
        now: datetime,
        measured: Mapping[PoolName, clocks.Clocks] | None = None,
    ) -> Observation:
        """What the seams show at ``now``; ``measured``: the clocks, measured before ``now`` was
        read (so that ``now`` is corrected by the same readings); None: measured here. Each
        pool's demand is the sample read, and its budget unknown: what the memory makes of
        them is ``runtime.perception``'s."""
        pools: dict[PoolName, model.PoolSnapshot] = {}
        read: dict[PoolName, PoolMetrics] = {}
        membership = self._membership()
        members = membership.members
        unreadable = dict(self.views.unreadable())
        if measured is None:
            measured = await self.measure_clocks()
        for pool in self.pools:
            views = members[pool.name]
            names = [v.name for v in views]
            # Read at Prometheus' now, not this controller's: a clock behind would be answered
            # with samples as old as it is behind, one ahead with none at all.
            seen_clocks = measured[pool.name]
            metrics = await self._read(pool.name, names, clocks.prometheus_now(seen_clocks, now))
            read[pool.name] = metrics
            history, failed = await self._history(pool, names, now)
            _say_unknown(pool.name, (*metrics.errors, *failed))
            pools[pool.name] = model.PoolSnapshot(
                nodes=views,
                demand=metrics.demand,
                queue=metrics.queue,
                history=history,
                cover=self._cover(pool, history),
                takers=self.views.pending(pool.marks) if pool.policy.lend_only_to_takers else (),
                alerts=self.alerts.firing(pool.name, now) if self.alerts is not None else (),
                orphans=membership.orphans.get(pool.name, frozenset()),
                overlaps=membership.overlaps.get(pool.name, {}),
                clocks=seen_clocks,
            )
        snapshot = model.Snapshot(now=now, pools=pools, paused=self.paused, frozen=self.frozen)
        return Observation(snapshot, read, measured, unreadable)

    async def measure_clocks(self) -> dict[PoolName, clocks.Clocks]:
        """Each pool's clocks this tick: the API server's skew (which the tick's ``now`` is
        already corrected by) and that of the pool's Prometheus. A clock that should be
        measured and has no reading lately is ``unmeasured``: the pool lends nothing."""
        unmeasured: set[clocks.Against] = set()
        skews: list[clocks.Skew] = []
        if self.apiserver_clock is not None:
            api = await self._safely_measure(self.apiserver_clock.measure_skew())
            skews += [api] if api is not None else []
            unmeasured |= {clocks.Against.APISERVER} if api is None else set()
        api_skew = skews[0] if skews else None
        correction = api_skew.offset if api_skew is not None and api_skew.known else timedelta(0)
        out: dict[PoolName, clocks.Clocks] = {}
        for pool in self.pools:
            mine, missing = list(skews), set(unmeasured)
            if self.prometheus_clock is not None:
                prom = await self._safely_measure(self.prometheus_clock.measure_skew(pool.name))
                mine += [prom] if prom is not None else []
                missing |= {clocks.Against.PROMETHEUS} if prom is None else set()
            out[pool.name] = clocks.Clocks(
                tuple(mine), frozenset(missing), self.clock_bound, correction
            )
        return out

    @staticmethod
    async def _safely_measure(measuring: Awaitable[clocks.Skew | None]) -> clocks.Skew | None:
        try:
            return await measuring
        except Exception:  # not measured is what it means: the pool lends nothing
            log.exception("a clock could not be measured")
            return None

    async def read_again(
        self, pool: PoolName, nodes: Sequence[NodeName], at: datetime
    ) -> PoolMetrics | None:
        """The pool's metrics as a read at ``at`` gave them (``Reconciler.recall_beliefs``);
        None, said at debug level, when the read fails or says it could not read: the caller
        stops there rather than wait on a Prometheus it cannot reach, once a step."""
        try:
            found = await self.metrics.read(pool, nodes, at)
        except Exception as exc:
            log.debug("pool %s: demand at %s not read again: %s", pool, at.isoformat(), exc)
            return None
        if found.demand is None and found.errors:
            log.debug("pool %s: demand at %s not read again: %s", pool, at, found.errors[0])
            return None
        return found

    async def _read(self, pool: PoolName, nodes: Sequence[NodeName], now: datetime) -> PoolMetrics:
        try:
            found = await self.metrics.read(pool, nodes, now)
        except Exception:  # unknown is never zero: no sample, the planner fails toward inference
            log.exception("pool %s: metrics read failed", pool)
            return PoolMetrics(pool=pool, demand=None, queue=None)
        return found  # its errors said by ``_say_unknown``, with the history's

    def _cover(self, pool: PoolConfig, history: model.DemandHistory | None) -> model.Cover | None:
        """What the pool's history covers, for its error budget: judged incrementally, one
        ``Jumps`` per pool, as each history read continues the last."""
        if pool.slo is None or history is None:
            return None
        jumps = self._jumps.get(pool.name)
        if jumps is None:
            jumps = self._jumps[pool.name] = exposure.Jumps(exposure.shape_of(pool.policy))
        return jumps.cover(history)

    async def _history(
        self, pool: PoolConfig, nodes: Sequence[NodeName], now: datetime
    ) -> tuple[model.DemandHistory | None, tuple[MetricError, ...]]:
        """The pool's demand history up to ``now`` floored to the refresh grid (``history_end``),
        read once per step of that grid: what any process reads at ``now`` is what the loop
        holds at ``now``, so ``rebalancer explain`` reconstructs it with one read. None when
        the pool's strategy reads none; with why this step's read failed, if it did."""
        if not pool.needs_history:
            return None, ()
        cached = self._histories.get(pool.name)
        hs = self.history_settings
        until = history_end(now, hs)
        if cached is not None and cached[0] == until:
            return cached[1], ()
        try:
            got = await self.metrics.history(pool.name, nodes, until - hs.span, until, hs.step)
        except Exception:
            log.exception("pool %s: demand history failed", pool.name)
            return (cached[1] if cached else model.DemandHistory.empty(now)), ()
        failed = () if got.error is None else (got.error,)
        if failed and cached is not None:  # keep the last good one; try again next tick
            return cached[1], failed
        self._histories[pool.name] = (until, got.history)
        return got.history, failed


def _say_unknown(pool: PoolName, errors: Sequence[MetricError]) -> None:
    """One warning per pool and reason, naming the metrics it left unknown: a Prometheus not
    reached fails every query alike, and four lines each quoting a long query say it no
    better. Each query is logged at debug."""
    metrics: dict[str, list[str]] = {}
    for error in errors:
        log.debug("%s", error)
        metrics.setdefault(error.reason, []).append(error.metric)
    for reason, names in metrics.items():
        named = sorted(set(names), key=lambda n: (_READ_ORDER.get(n, len(_READ_ORDER)), n))
        log.warning("pool %s: %s unknown: %s", pool, ", ".join(named), reason)


# The metrics in the order a person reads them (the adapter's reads finish in any order).
_READ_ORDER = {name: i for i, name in enumerate(("demand", "queue", "running", "gpu_busy"))}


def history_end(now: datetime, settings: HistorySettings) -> datetime:
    """Where the demand history read at ``now`` ends: ``now`` floored to ``settings.refresh``
    (a multiple of its step), on the wall clock's grid, not to when this process last read.

    Why a grid: the loop reads the history at most once per ``refresh`` and keeps it; were the
    read's end the moment of the read, a process that reads at ``now`` (``rebalancer explain``)
    would see minutes the loop does not hold yet, and the two would answer differently for up
    to ``refresh`` (a strategy's peak over the last minutes, seen by one and not the other). On
    the grid, every process holds the same window at the same ``now``."""
    return _floor(now, settings.refresh)


def _floor(when: datetime, step: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + step * ((when - epoch) // step)
