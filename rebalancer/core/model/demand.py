"""A pool's demand: the unit it is counted in, one sample of it, and its history; what the
metrics give and every strategy reads."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class Unit(StrEnum):
    """What a pool's demand, and one node's capacity, are counted in: the operator's choice
    (``capacity.unit``). The planner's arithmetic does not care which (it compares demand with
    nodes times the capacity of one); the words it writes, and a waiting queue's size in
    nodes, do."""

    REQUESTS_PER_SECOND = "requests_per_second"  # requests completed per second
    TOKENS_PER_SECOND = "tokens_per_second"  # tokens generated per second
    CONCURRENT_SEQUENCES = "concurrent_sequences"  # requests in flight at once

    @property
    def symbol(self) -> str:
        """How a figure is written in a sentence: ``120 rps``, ``9500 tokens/s``."""
        return _SYMBOLS[self]

    def backlog_nodes(self, waiting: float, per_node: float) -> int | None:
        """Nodes that take ``waiting`` queued requests off the queue within a minute; None
        when a request has no size in this unit (tokens: a request's length is not known)."""
        if self is Unit.REQUESTS_PER_SECOND:
            return max(1, math.ceil(waiting / (per_node * 60)))
        if self is Unit.CONCURRENT_SEQUENCES:  # each waiting request takes a sequence's place
            return max(1, math.ceil(waiting / per_node))
        return None


_SYMBOLS = {
    Unit.REQUESTS_PER_SECOND: "rps",
    Unit.TOKENS_PER_SECOND: "tokens/s",
    Unit.CONCURRENT_SEQUENCES: "sequences",
}


@dataclass(frozen=True, slots=True)
class Sample:
    """One metric value with the time Prometheus says it was sampled (never the query time)."""

    value: float
    at: datetime

    def age(self, now: datetime) -> timedelta:
        return now - self.at


@dataclass(frozen=True, slots=True)
class DemandHistory:
    """Demand in the pool's unit (``Unit``) on a regular grid, up to (and never past) ``end``.

    ``values[i]`` is the demand over ``[start + i*step, start + (i+1)*step)``; ``None`` is a gap
    (no sample), which is never read as zero. Strategies use it for same-hour-yesterday
    forecasts and trends; the simulator passes a view that ends where the metric pipeline ends,
    so no strategy can peek at the future.
    """

    start: datetime
    step: timedelta
    values: Sequence[float | None]
    end_index: int  # exclusive: values[end_index:] are not visible

    @property
    def end(self) -> datetime:
        return self.start + self.step * self.end_index

    def index_of(self, when: datetime) -> int:
        return math.floor((when - self.start) / self.step)

    def window(self, since: datetime, until: datetime) -> list[float]:
        """Known values whose bucket starts in ``[since, until)``, clipped to what is visible."""
        lo = max(0, self.index_of(since))
        hi = min(self.end_index, self.index_of(until))
        if hi <= lo:
            return []
        return [v for v in self.values[lo:hi] if v is not None]

    @staticmethod
    def empty(at: datetime) -> DemandHistory:
        return DemandHistory(start=at, step=timedelta(minutes=1), values=(), end_index=0)
