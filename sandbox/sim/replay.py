"""A load source that replays a trace behind the reconciler's metrics seam.

``Replay`` satisfies ``runtime.seams.MetricsSource``: it answers ``read`` with the demand of
the trace minute before the clock's current minute, stamped ``sample_age`` before it (the age a
scrape-and-query pipeline has, as in docs/evaluation.md), and ``history`` with the trace up to
(never past) that minute. The clock is the emulator's ``ManualClock``: whoever drives the replay
advances it by one trace minute per step, so the controller's time, cooldowns and deadlines
follow the trace.

The queue sample is a fluid queue, ``q += (r - c * serving) * 60 s`` floored at zero, which the
driver feeds with ``record(serving)`` once per minute (the replay cannot see the cluster).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from rebalancer.core import model
from rebalancer.core.model import HistoryResult, NodeName, PoolMetrics, PoolName
from sandbox.sim.traces import MINUTE, Trace


@dataclass
class Replay:
    trace: Trace
    clock: Callable[[], datetime]
    rps_per_node: float
    sample_age: timedelta = timedelta(seconds=30)
    queue: float = 0.0
    reads: int = 0

    def minute(self, when: datetime | None = None) -> int:
        """The trace index of the minute ``when`` (default: now) falls in."""
        at = self.clock() if when is None else when
        return (at - self.trace.start) // MINUTE

    def demand_at(self, index: int) -> float | None:
        """The demand that actually arrives in trace minute ``index`` (None: a gap)."""
        if 0 <= index < self.trace.minutes:
            return self.trace.rps[index]
        return None

    def record(self, serving: int) -> None:
        """The minute that just began is served by ``serving`` warm nodes: move the queue."""
        demand = self.demand_at(self.minute())
        if demand is not None:
            self.queue = max(0.0, self.queue + (demand - self.rps_per_node * serving) * 60.0)

    async def read(
        self, pool: PoolName, nodes: Iterable[NodeName], now: datetime | None = None
    ) -> PoolMetrics:
        self.reads += 1
        now = self.clock() if now is None else now
        t = min(self.minute(now), self.trace.minutes)
        last = t - 1
        while last >= 0 and self.trace.rps[last] is None:
            last -= 1
        if last < 0:
            return PoolMetrics(pool, None, None)
        value = self.trace.rps[last]
        assert value is not None
        at = self.trace.start + MINUTE * (last + 1) - self.sample_age
        queue = model.Sample(self.queue, self.trace.start + MINUTE * t - self.sample_age)
        return PoolMetrics(pool, model.Sample(value, at), queue)

    async def history(
        self,
        pool: PoolName,
        nodes: Iterable[NodeName],
        since: datetime,
        until: datetime,
        step: timedelta,
    ) -> HistoryResult:
        """The trace up to ``until`` (and up to now: never the future), on its minute grid."""
        end = max(0, min(self.minute(until), self.minute(), self.trace.minutes))
        return HistoryResult(
            model.DemandHistory(
                start=self.trace.start, step=MINUTE, values=self.trace.rps, end_index=end
            )
        )
