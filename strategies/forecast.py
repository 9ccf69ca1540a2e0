"""Proactive lending: keep enough nodes serving for the load expected by the time a reclaimed
node could be warm again, so that drain and cold start are hidden from inference.

A node taken back now serves again only after ``return_time`` (drain plus warm-up). So the
question each tick is not "how busy are we?" but "how busy can we be within ``return_time``?".
The strategy answers with the largest of three estimates of demand over that horizon:

- recent: the peak of the last ``recent_minutes``; load rarely falls off a cliff;
- trend: the last ``trend_minutes`` fitted with a line and carried to the horizon, when rising;
- seasonal: on each of the previous ``days`` days, the peak over the same stretch of the day,
  scaled by how today's last hour compares with that day's; the median over the days, so one
  odd day neither drives nor hides a ramp.

It then keeps serving what that estimate needs with the pool's headroom, times a safety factor
that grows with how jumpy the load has been (the spread of minute-to-minute changes over
``volatility_minutes``, scaled to the horizon). Hysteresis comes from asymmetry: a reclaim reacts
to the peak of the last ``recent_minutes``, a new loan needs the peak of a longer span (plus
``hold_minutes``) to allow it. With no history (the first day) the seasonal term is absent and
the strategy is a cautious reactive one. See docs/strategies.md for the figures behind the
defaults and the traces they were checked on.
"""

from __future__ import annotations

import math
import statistics
from datetime import timedelta
from typing import ClassVar

import pydantic

from rebalancer.core import model
from strategies import base

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


class Params(base.Params):
    recent_minutes: int = pydantic.Field(default=15, ge=1, le=24 * 60)
    hold_minutes: int = pydantic.Field(default=15, ge=0, le=24 * 60)
    trend_minutes: int = pydantic.Field(default=30, ge=3, le=24 * 60)
    days: int = pydantic.Field(default=7, ge=0, le=28)
    seasonal_slack_minutes: int = pydantic.Field(default=15, ge=0, le=24 * 60)
    safety: float = pydantic.Field(default=0.1, ge=0, le=5)
    volatility_z: float = pydantic.Field(default=1.0, ge=0, le=10)
    volatility_minutes: int = pydantic.Field(default=240, ge=10, le=7 * 24 * 60)


class Forecast:
    name: ClassVar[str] = "forecast"

    def __init__(self, params: Params) -> None:
        self.params = params

    def decide(self, pool: model.PoolView) -> model.Proposal:
        if pool.demand is None:
            return model.Proposal(pool.lent, "demand unknown: holding")
        p, now, history = self.params, pool.now, pool.history
        horizon = pool.return_time + history.step
        recent = history.window(now - timedelta(minutes=p.recent_minutes), now)
        longer = history.window(now - timedelta(minutes=p.recent_minutes + p.hold_minutes), now)
        current = pool.demand.value
        trend = self._trend(pool, horizon)
        seasonal = self._seasonal(pool, horizon)
        factor = 1.0 + p.safety + p.volatility_z * self._volatility(pool)
        expected = max(max(recent, default=current), current, trend, seasonal)
        expected_long = max(max(longer, default=current), expected)
        keep_now = pool.need(expected * factor)
        keep_long = pool.need(expected_long * factor)
        evidence: dict[str, float | str] = {
            "current_rps": current,
            "recent_peak_rps": max(recent, default=current),
            "trend_rps": trend,
            "seasonal_rps": seasonal,
            "safety_factor": factor,
            "keep_serving": keep_now,
        }
        if pool.size - keep_long > pool.lent:
            target = pool.size - keep_long
            why = f"expect at most {expected_long * factor:.1f} rps: {keep_long} nodes serve it"
        elif pool.size - keep_now < pool.lent:
            target = max(0, pool.size - keep_now)
            why = f"expect up to {expected * factor:.1f} rps within {horizon}: keep {keep_now}"
        else:
            target = pool.lent
            why = "forecast within the hysteresis band: holding"
        return model.Proposal(target, why, evidence)

    def _trend(self, pool: model.PoolView, horizon: timedelta) -> float:
        """The recent slope carried to the horizon; 0 when flat or falling."""
        history = pool.history
        values = history.window(pool.now - timedelta(minutes=self.params.trend_minutes), pool.now)
        if len(values) < 3:
            return 0.0
        n = len(values)
        mean_x, mean_y = (n - 1) / 2, math.fsum(values) / n
        spread = sum((x - mean_x) ** 2 for x in range(n))
        slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / spread
        if slope <= 0:
            return 0.0
        return mean_y + slope * (n - 1 + horizon / history.step - mean_x)

    def _seasonal(self, pool: model.PoolView, horizon: timedelta) -> float:
        """Median over previous days of their peak over the horizon, scaled to today's level."""
        p, now, history = self.params, pool.now, pool.history
        level_now = history.window(now - HOUR, now)
        if not level_now:
            return 0.0
        today = _mean(level_now)
        reach = horizon + timedelta(minutes=p.seasonal_slack_minutes)
        predictions = []
        for days_back in range(1, p.days + 1):
            then = now - days_back * DAY
            level_then = history.window(then - HOUR, then)
            ahead = history.window(then, then + reach)
            if level_then and ahead:
                base = _mean(level_then)
                if base > 0:
                    predictions.append(max(ahead) * today / base)
        return statistics.median(predictions) if predictions else 0.0

    def _volatility(self, pool: model.PoolView) -> float:
        """Spread of minute-to-minute relative changes over the recent past."""
        values = pool.history.window(
            pool.now - timedelta(minutes=self.params.volatility_minutes), pool.now
        )
        changes = [
            math.log(b / a) for a, b in zip(values, values[1:], strict=False) if a > 0 and b > 0
        ]
        if len(changes) < 10:
            return 0.2  # too little to judge: assume a jumpy load
        mean = _mean(changes)
        return math.sqrt(_mean([(c - mean) ** 2 for c in changes]))


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)
