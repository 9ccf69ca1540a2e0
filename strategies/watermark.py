"""Hysteresis on utilisation: lend when load has stayed low for a while, reclaim at once when
it is high or requests queue.

Utilisation is demand over what the serving nodes can carry. Below ``low`` for ``hold_minutes``
(judged on the peak of that span, so one quiet minute is not enough), lend until the serving
nodes would run at ``target`` for that peak. Above ``high``, take back enough nodes to run at
``target`` again; with more than ``queue_high`` requests waiting, also enough to clear the
backlog within a minute (demand understates the need while requests wait). In between, hold. The gap
between ``low`` and ``high`` is what stops flapping.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import ClassVar

import pydantic

from rebalancer.core import model, strategy


class Params(strategy.Params):
    low: float = pydantic.Field(default=0.45, gt=0, lt=1)
    high: float = pydantic.Field(default=0.75, gt=0, le=1)
    target: float = pydantic.Field(default=0.6, gt=0, lt=1)
    hold_minutes: int = pydantic.Field(default=20, ge=1, le=24 * 60)
    queue_high: float = pydantic.Field(default=1.0, ge=0)

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> Params:
        if not self.low < self.target < self.high:
            raise ValueError(
                f"need low < target < high, got {self.low} < {self.target} < {self.high}"
            )
        return self


class Watermark:
    name: ClassVar[str] = "watermark"
    reads_history: ClassVar[bool] = True

    def __init__(self, params: Params) -> None:
        self.params = params

    def decide(self, pool: model.PoolView) -> model.Proposal:
        p = self.params
        if pool.demand is None:
            return model.Proposal(pool.lent, "demand unknown: holding")
        demand = pool.demand.value
        serving = max(1, pool.size - pool.lent)
        capacity = pool.rps_per_node * serving
        utilisation = demand / capacity
        queue = pool.queue.value if pool.queue is not None else 0.0
        evidence: dict[str, float | str] = {"utilisation": utilisation, "queue": queue}
        if utilisation > p.high or queue > p.queue_high:
            keep = self._serving_for(demand, pool)
            why = f"utilisation {utilisation:.2f} > {p.high}"
            if queue > p.queue_high:
                # Demand understates the need while requests wait: add nodes for the backlog
                # (one, in a unit a waiting request has no size in).
                backlog = pool.unit.backlog_nodes(queue, pool.rps_per_node) or 1
                keep = max(keep, serving + backlog)
                why = f"queue {queue:.0f} > {p.queue_high:.0f}"
            return model.Proposal(max(0, min(pool.lent, pool.size - keep)), why, evidence)
        held = pool.history.window(pool.now - timedelta(minutes=p.hold_minutes), pool.now)
        if len(held) >= p.hold_minutes * 0.8:
            peak = max(held)
            evidence["held_peak_rps"] = peak
            if peak / capacity < p.low:
                keep = self._serving_for(peak, pool)
                return model.Proposal(
                    max(pool.lent, pool.size - keep),
                    f"utilisation below {p.low} for {p.hold_minutes} min",
                    evidence,
                )
        return model.Proposal(pool.lent, "between the watermarks: holding", evidence)

    def _serving_for(self, rps: float, pool: model.PoolView) -> int:
        return max(pool.min_serving, math.ceil(rps / (pool.rps_per_node * self.params.target)))


PLUGIN = strategy.Plugin(Params, Watermark, "hysteresis on utilisation: lend after a quiet spell")
