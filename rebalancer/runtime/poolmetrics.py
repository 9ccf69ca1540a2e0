"""The controller's metrics source: one source per pool behind one ``MetricsSource``.

Where it sits: ``runtime.wiring`` builds one Prometheus ``Metrics`` per pool (each pool has its
own queries) and puts them behind ``PoolMetricsRouter``, which the reconciler reads as its
``MetricsSource`` and as its ``PrometheusClock``; the demo puts a replayed trace per pool behind
it instead. In the runtime rather than beside ``adapters.metrics``: what it routes to is the
runtime's seam (``MetricsSource``), a replayed trace as well as Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from rebalancer.adapters.metrics import Metrics
from rebalancer.core import clocks
from rebalancer.core.model import HistoryResult, NodeName, PoolMetrics, PoolName
from rebalancer.runtime.seams import MetricsSource


@dataclass
class PoolMetricsRouter:
    """``MetricsSource`` over one source per pool (each pool has its own queries, or its own
    replayed trace)."""

    by_pool: Mapping[PoolName, MetricsSource]

    async def measure_skew(self, pool: PoolName) -> clocks.Skew | None:
        """The clock of the pool's Prometheus (``Metrics.measure_skew``); None for a source
        that has no clock to read (a replayed trace)."""
        source = self.by_pool[pool]
        return await source.measure_skew() if isinstance(source, Metrics) else None

    async def read(
        self, pool: PoolName, nodes: Iterable[NodeName], now: datetime | None = None
    ) -> PoolMetrics:
        return await self.by_pool[pool].read(pool, nodes, now)

    async def history(
        self,
        pool: PoolName,
        nodes: Iterable[NodeName],
        since: datetime,
        until: datetime,
        step: timedelta,
    ) -> HistoryResult:
        return await self.by_pool[pool].history(pool, nodes, since, until, step)
