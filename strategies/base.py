"""What the built-in strategies share beyond the contract.

The contract itself (``Strategy``, ``Params``, ``Plugin``) lives in ``rebalancer.core.strategy``,
where the controller can hold a strategy without importing this package; ``Params`` and
``Strategy`` are named here too, for code written against this module before they moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from rebalancer.core import model
from rebalancer.core.strategy import Params, Strategy

__all__ = ["Params", "Strategy", "same_series"]


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
