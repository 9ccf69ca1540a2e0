"""What every strategy is: a pure function of a ``PoolView`` with validated parameters."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import ClassVar, Protocol

import pydantic

from rebalancer.core import model


class Params(pydantic.BaseModel):
    """Base of strategy parameters: unknown keys are errors, values are immutable."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class Strategy(Protocol):
    name: ClassVar[str]
    # Whether ``decide`` reads ``pool.history``: the runtime asks Prometheus for the demand
    # history (days of it, refreshed every few minutes) only for a strategy that does.
    reads_history: ClassVar[bool]

    def decide(self, pool: model.PoolView) -> model.Proposal:
        """How many nodes of ``pool`` should be lent at ``pool.now``, and why."""
        ...


def same_series(
    history: model.DemandHistory,
    values: Sequence[float | None],
    start: datetime,
    step: timedelta,
    end: int,
) -> bool:
    """Whether ``history`` is the series a memo was built on (the same ``values`` object, start
    and step), at or past the step before ``end``, where the memo left off. Anything else (a
    copy, another series, a step back in time) rebuilds the memo from the history alone."""
    return (
        values is history.values
        and (start, step) == (history.start, history.step)
        and history.end_index >= end - 1
    )
