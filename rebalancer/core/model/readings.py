"""What the metrics and leadership seams answer: a pool's metric readings, why one is unknown,
and a stretch of leadership."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from rebalancer.core import bounded
from rebalancer.core.model.demand import DemandHistory, Sample
from rebalancer.core.model.names import NodeName, PoolName


@dataclass(frozen=True)
class MetricError:
    """Why a metric of a pool is unknown: a failed or refused query. Never raised."""

    pool: str
    metric: str
    query: str
    reason: str  # may quote what Prometheus answered: cut where it enters

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", bounded.cut(self.reason, bounded.SENTENCE))

    def __str__(self) -> str:
        return f"pool {self.pool}: {self.metric} unknown: {self.reason} (query: {self.query})"


@dataclass(frozen=True)
class PoolMetrics:
    """One pool's load. ``None`` is unknown (see ``errors`` for why, when it was an error)."""

    pool: PoolName
    demand: Sample | None
    queue: Sample | None
    running: Sample | None = None
    gpu_busy: Mapping[NodeName, Sample] = field(default_factory=dict)
    errors: tuple[MetricError, ...] = ()


@dataclass(frozen=True)
class HistoryResult:
    history: DemandHistory
    error: MetricError | None = None


@dataclass(frozen=True)
class Term:
    """One uninterrupted stretch of leadership, as the audit log records it."""

    holder: str
    number: int  # the lease's leaseTransitions written when the stretch began
    acquired: datetime
