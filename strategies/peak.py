"""Keep what the recent peak needs, with a margin: lend ``size - need(max demand over the last
``window_minutes`` x (1 + margin))``.

A rule a few lines long, and a strong one on jumpy services: a load that jumped once within the
window is assumed to be able to jump as high again, so the pool keeps room for it until the
window has passed. Its weakness is the ramp nothing recent foresees (a morning rise) and the
harvest a long window gives up on a smooth load. ``forecast`` answers both; ``peak`` is the
frontier the robustness suite (``bench/robustness.py``) holds it to.

With an error budget (``PoolView.budget``) and ``spent_margin`` set, the margin moves with the
budget: ``margin`` while none of it is spent, ``spent_margin`` once it is gone, in proportion in
between, so a pool that breaches widens its margin and one that does not narrows it again as
its breaches leave the budget's window.
"""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

import pydantic

from rebalancer.core import model, strategy


class Params(strategy.Params):
    window_minutes: int = pydantic.Field(default=60, ge=1, le=7 * 24 * 60)
    margin: float = pydantic.Field(
        default=0.15, ge=0.0, le=100.0, description="the margin; with a budget, while unspent"
    )
    spent_margin: float | None = pydantic.Field(
        default=None,
        ge=0.0,
        le=100.0,
        description="with an error budget, the margin once it is spent (None: margin)",
    )


class Peak:
    name: ClassVar[str] = "peak"
    reads_history: ClassVar[bool] = True

    def __init__(self, params: Params) -> None:
        self.params = params

    def decide(self, pool: model.PoolView) -> model.Proposal:
        if pool.demand is None:
            return model.Proposal(pool.lent, "peak: demand unknown, holding")
        since = pool.now - timedelta(minutes=self.params.window_minutes)
        top = max([pool.demand.value, *pool.history.window(since, pool.now)])
        margin = self.margin(pool.budget)
        keep = pool.need(top * (1.0 + margin))
        return model.Proposal(
            max(0, pool.size - keep),
            f"peak: {top:.1f} {pool.unit.symbol} at most over {self.params.window_minutes} min, "
            f"+{margin:.0%}, keeps {keep}",
            {"peak_rps": top, "keep": keep, "margin": margin},
        )

    def margin(self, budget: model.ErrorBudget | None) -> float:
        """``margin`` while the budget is unspent, ``spent_margin`` once it is gone, and in
        between in proportion to what the rolling window has spent."""
        low, high = self.params.margin, self.params.spent_margin
        if budget is None or high is None:
            return low
        return low + (high - low) * min(1.0, budget.burned)


PLUGIN = strategy.Plugin(Params, Peak, "keep what the recent peak needs, with a margin")
