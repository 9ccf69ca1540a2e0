"""What lending may cost a pool: its ``Slo``, the ``ErrorBudget`` spent against it, and the
``Cover`` its history gives; a room apart because strategies and the planner spend it alike."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from rebalancer.core.model.demand import Unit


@dataclass(frozen=True, slots=True)
class ErrorBudget:
    """How much risk a pool may still take: breach minutes allowed per rolling ``window``, and
    how many the window before ``now`` has spent. A strategy spends it instead of a fixed
    margin: wider while it burns, narrower while it is unspent."""

    allowed_minutes: int
    window: timedelta
    spent_minutes: int

    @property
    def burned(self) -> float:
        """The share spent: 0 untouched, 1 (or more) gone; a budget of zero is always gone."""
        if self.allowed_minutes <= 0:
            return 1.0
        return self.spent_minutes / self.allowed_minutes

    def covers(self, minutes: int) -> bool:
        """Whether ``minutes`` more could be spent within the budget."""
        return self.spent_minutes + minutes <= self.allowed_minutes

    @property
    def spent_text(self) -> str:
        """``3 of 10 minute(s) spent in the last 7 day(s)``."""
        days, rest = divmod(self.window, timedelta(days=1))
        span = f"{days} day(s)" if not rest else f"{self.window / timedelta(hours=1):g} hour(s)"
        return f"{self.spent_minutes} of {self.allowed_minutes} minute(s) spent in the last {span}"


@dataclass(frozen=True, slots=True)
class Jump:
    """The largest jump of demand within one loan's risk over one peak window's peak, in the
    span a ``Cover`` was judged on; ``peak`` is that window's peak at its end."""

    window: timedelta
    peak: float | None  # over the window's last minutes with traffic; None: none yet
    ratio: float  # what the cover takes: ``seen``, stretched (``core.exposure``)
    seen: float  # the largest jump seen; infinite (an overflow) covers nothing


@dataclass(frozen=True, slots=True)
class Cover:
    """What the pool's own history says its loans are exposed to (``core.exposure``): warm
    serving nodes that carry a window's peak times its largest jump would have ridden out
    every jump of demand the last ``judged`` held within one loan's risk. Loans that leave that
    much serving are *covered*; the rest are *exposed* and spend the error budget
    (docs/design/budget.md)."""

    jumps: tuple[Jump, ...]
    judged: timedelta
    # The most the coming minutes brought at this time of day on the last days: a return to a
    # level the pool saw at this hour is no jump, however far it is from the recent peak.
    usual: float | None = None

    def demand(self, rps: float | None = None) -> tuple[float, Jump] | None:
        """The least demand that covers, with the window that gives it; ``rps``, a sample newer
        than the history, raises every peak to it. None: no window covers anything."""
        best: tuple[float, Jump] | None = None
        for jump in self.jumps:
            peaks = [p for p in (jump.peak, rps) if p is not None]
            if not peaks or math.isinf(jump.ratio):
                continue
            covered = max(peaks) * jump.ratio
            if best is None or covered < best[0]:
                best = (covered, jump)
        if best is not None and self.usual is not None and self.usual > best[0]:
            return (self.usual, best[1])
        return best

    def keep(self, need: Callable[[float], int], rps: float | None = None) -> int | None:
        """The serving nodes the covering demand ``need``s (None: no window covers)."""
        found = self.demand(rps)
        return None if found is None else need(found[0])

    def text(self, rps: float | None = None, unit: Unit = Unit.REQUESTS_PER_SECOND) -> str:
        """``the 30-minute peak 120 rps x 1.45, the largest jump within a loan's risk in the
        last 8 days``; the figure in ``unit``. (A window's minutes are those with traffic:
        ``core.exposure``.)"""
        found = self.demand(rps)
        days = f"{self.judged / timedelta(days=1):.3g}"
        if found is None:
            return f"no peak window covers a jump of the last {days} days"
        covered, jump = found
        minutes = jump.window / timedelta(minutes=1)
        return (
            f"{covered:.4g} {unit.symbol}, the {minutes:g}-minute peak x {jump.ratio:.3g} (the "
            f"largest jump within a loan's risk in the last {days} days was {jump.seen:.3g}), "
            "or the most this hour brought on the last days"
        )


@dataclass(frozen=True, slots=True)
class Slo:
    """A pool's error budget: at most ``max_breach_minutes`` minutes per rolling ``window`` in
    which lending cost the pool (a live pool: requests queued beyond its limit while nodes were
    away on loan; the simulator: warm capacity below demand)."""

    max_breach_minutes: int
    window: timedelta = timedelta(days=7)

    def budget(self, spent: Iterable[datetime], now: datetime) -> ErrorBudget:
        """The budget at ``now``, given the minutes that cost the pool (those within the window
        before ``now`` count)."""
        since = now - self.window
        count = sum(1 for minute in spent if since < minute <= now)
        return ErrorBudget(self.max_breach_minutes, self.window, count)
