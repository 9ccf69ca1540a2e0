"""Proactive lending: keep enough nodes serving for the demand that can arrive before a node
taken back now could serve again, and learn from the last day how wrong that estimate can be.

A node reclaimed at minute ``t`` serves again at ``t + return_time`` (drain plus warm-up), and a
decision at ``t`` sees demand only up to ``t - 1``. So every tick asks: what may demand reach
over the next ``return_time + 1`` minutes? The answer is the largest of:

- trend: a straight line fitted to the last ``fit_minutes`` of demand, read at the last minute
  and, when it rises, carried to the end of the horizon. A fit, not a peak: minute-to-minute
  noise averages out instead of being kept as capacity (the Azure LLM weeks move by a median
  5 % (conv) and 8 % (code) from one minute to the next, and a "recent peak" estimate pays for
  that noise all day);
- seasonal: on each of the previous ``days`` days, the peak over the same stretch of the day
  (plus ``seasonal_slack_minutes``, time to reclaim a large ramp at the planner's per-tick
  limit), scaled by how today's last hour compares with that day's; the median over the days.
  It foresees a ramp that comes back every day, which no recent-history estimate can;
- the last sample itself, which the planner enforces anyway.

The trend estimate is multiplied by ``1 + margin`` before the pool's headroom is applied; the
seasonal forecast and the last sample carry no margin, the planner's headroom is theirs. The
margin is the largest of three:

- ``safety``, a floor for loads that have not shown how jumpy they are yet;
- jumpiness: ``jumpiness_z`` times the root mean square of the log change from one horizon's
  mean demand to the next, over the last ``jumpiness_minutes``. It is measured at the scale
  that matters (one horizon), where minute noise has averaged out but level shifts have not.
  Zero after zero is no change; a rise out of exactly zero is one no ratio can size, so the
  margin is unbounded (the whole pool serves) until that rise leaves the span;
- learned: for every minute of the last ``memory_minutes``, the smallest margin that would
  have kept capacity above demand over that minute's horizon, given what was kept then. A
  load that has outrun its estimate recently keeps room for as large a miss, for a day.

Lending is asymmetric. A reclaim follows the keep computed now; a loan needs the largest keep
of the last ``return_time - 1`` minutes (plus ``hold_minutes``) to allow it, so a node is never
lent while one reclaimed for the same rise may still be on its way back (lending it would cut
serving below what the reclaim was for). After a run of missing samples at least
``return_time`` long (the planner has then reclaimed everything), the fit starts afresh and
nothing is lent until ``min_history_minutes`` of demand are known again: the first samples
after an outage are often partial.

Figures (bench/strategy_sweep.py, 16 nodes, peak at 90 % of the pool). On the Azure LLM weeks
the jumpiness margin alone (``safety`` = 0) keeps ``code`` free of breaches and ``conv`` but
for one minute: 2024-05-16 01:47 UTC, when demand jumps 35 % (9.0 to 12.1 node-capacities,
then 11.2 and 11.3) with nothing before it, that day or earlier ones, to learn from. 0.21 is
the least ``safety`` that covers it; each 0.01 above costs ``conv`` about 1.3 % of its harvest
(0.757 at the default 0.22, 0.835 at 0 with that one breach minute). Neither Azure week ever
misses by more than ``safety``, so the learned margin costs them nothing. On the ServeGen
traces (10-minute steps whose level jumps 1.5-3x out of calm stretches) the jumpiness and
learned margins cut breach minutes on m-large/m-mid/m-small from 62/73/80 to 21/25/44. The
rest are first-of-a-kind jumps: no breach at all takes ``safety`` 1.5 (m-small) or 2
(m-large), where ``conv`` keeps 7 % and 1 % of its harvest, and m-mid still breaches at 3
(two hours of near-zero demand, then full load).

The strategy keeps per-pool memos of what it derived from the history (estimates, misses,
horizon changes), so a tick costs one fit rather than a day of them. They depend only on the
history: another series (a different ``values`` object, start or step), other pool figures or
a step back in time rebuild them from the history alone, with the same result.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar

import pydantic

from rebalancer.core import model, strategy
from strategies import base

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)


class Params(strategy.Params):
    fit_minutes: int = pydantic.Field(
        default=90, ge=10, le=24 * 60, description="span of the straight-line fit"
    )
    safety: float = pydantic.Field(
        default=0.22, ge=0, le=5, description="least margin on the trend estimate"
    )
    memory_minutes: int = pydantic.Field(
        default=24 * 60,
        ge=0,
        le=7 * 24 * 60,
        description="how long a miss of the estimate raises the margin; 0 turns learning off",
    )
    min_history_minutes: int = pydantic.Field(
        default=30, ge=3, le=24 * 60, description="demand to see before lending, after a gap"
    )
    hold_minutes: int = pydantic.Field(
        default=0, ge=0, le=24 * 60, description="extra wait before lending, beyond the return"
    )
    days: int = pydantic.Field(default=7, ge=0, le=28, description="days of seasonal history")
    seasonal_slack_minutes: int = pydantic.Field(
        default=15, ge=0, le=24 * 60, description="seasonal look-ahead beyond the horizon"
    )
    jumpiness_z: float = pydantic.Field(
        default=2.5, ge=0, le=10, description="margin in standard deviations of horizon changes"
    )
    jumpiness_minutes: int = pydantic.Field(
        default=4 * 60, ge=10, le=7 * 24 * 60, description="span the jumpiness is measured over"
    )

    @pydantic.model_validator(mode="after")
    def _enough_fit(self) -> Params:
        if self.min_history_minutes > self.fit_minutes:
            raise ValueError(
                f"min_history_minutes={self.min_history_minutes} must not exceed "
                f"fit_minutes={self.fit_minutes}"
            )
        return self


@dataclass(frozen=True, slots=True)
class _Tick:
    """What the strategy derived at one tick (history up to, not including, its index)."""

    estimate: float | None  # trend estimate in rps; None: too little history to lend on
    slope: float  # rps per step of the fit
    seasonal: float  # rps; 0 when there is no earlier day
    floor: int  # nodes the last sample and the seasonal forecast need, without margin
    margin: float  # the margin applied at this tick: max(safety, jumpiness, learned)
    jumpiness: float  # jumpiness_z times the spread of horizon-to-horizon changes
    learned: float  # the largest miss of the last memory_minutes
    keep: int | None  # nodes to keep serving; None: lend nothing


@dataclass
class _Memory:
    """One pool's memo, valid for one series and one set of pool figures."""

    values: Sequence[float | None]
    start: datetime
    step: timedelta
    figures: tuple[float, float, int, int, timedelta]  # what _Tick values were computed with
    end: int = 0  # ticks are known for indices < end
    ticks: dict[int, _Tick] = field(default_factory=dict)
    misses: deque[tuple[int, float]] = field(default_factory=deque)  # (index, margin needed)
    changes: deque[tuple[int, float]] = field(default_factory=deque)  # (index, squared change)

    def matches(self, pool: model.PoolView) -> bool:
        same = base.same_series(pool.history, self.values, self.start, self.step, self.end)
        return same and self.figures == _figures(pool)


class Forecast:
    name: ClassVar[str] = "forecast"
    reads_history: ClassVar[bool] = True

    def __init__(self, params: Params) -> None:
        self.params = params
        self._memos: dict[model.PoolName, _Memory] = {}

    def decide(self, pool: model.PoolView) -> model.Proposal:
        if pool.demand is None:
            return model.Proposal(pool.lent, "demand unknown: holding")
        history = pool.history
        now = history.end_index
        ticks = self._advance(pool)
        tick = ticks[now]
        hold = (
            self._steps(pool.return_time, history.step)
            - 1
            + self._minutes(self.params.hold_minutes, history.step)
        )
        recent = [ticks.get(i) for i in range(max(0, now - hold), now + 1)]
        evidence: dict[str, float | str] = {
            "current_rps": pool.demand.value,
            "slope_rps_per_minute": tick.slope * (MINUTE / history.step),
            "seasonal_rps": tick.seasonal,
            "margin": tick.margin if math.isfinite(tick.margin) else "unbounded",
            "jumpiness_margin": tick.jumpiness if math.isfinite(tick.jumpiness) else "unbounded",
            "learned_margin": tick.learned if math.isfinite(tick.learned) else "unbounded",
        }
        if tick.estimate is not None:
            evidence["estimate_rps"] = tick.estimate
        if tick.keep is None:
            return model.Proposal(0, "too little recent demand history: lending nothing", evidence)
        keep_now = tick.keep
        keep_long = max(
            (pool.size if t is None or t.keep is None else t.keep for t in recent),
            default=keep_now,
        )
        evidence["keep_serving"] = keep_now
        evidence["keep_for_lending"] = keep_long
        if pool.size - keep_long > pool.lent:
            target = pool.size - keep_long
            why = f"the last {hold + 1} ticks need at most {keep_long} serving nodes"
        elif pool.size - keep_now < pool.lent:
            target = max(0, pool.size - keep_now)
            why = (
                f"demand may reach what {keep_now} nodes serve within {pool.return_time} "
                f"(margin {_margin_text(tick.margin)})"
            )
        else:
            target = pool.lent
            why = "forecast within the hysteresis band: holding"
        return model.Proposal(target, why, evidence)

    # -----------------------------------------------------------------------------------------
    # The memo: one _Tick per history index, and the misses of the last memory_minutes.

    def _advance(self, pool: model.PoolView) -> dict[int, _Tick]:
        p, history = self.params, pool.history
        now, step = history.end_index, history.step
        horizon = self._steps(pool.return_time + step, step)
        hold = self._steps(pool.return_time, step) + self._minutes(p.hold_minutes, step)
        memory = self._minutes(p.memory_minutes, step) if p.memory_minutes else 0
        jumpiness = self._minutes(p.jumpiness_minutes, step)
        # Ticks needed to rebuild the state of ``now`` from the history alone.
        span = hold + max(memory, jumpiness) + 2 * horizon
        memo = self._memos.get(pool.name)
        if memo is None or not memo.matches(pool) or now - memo.end > span:
            memo = _Memory(history.values, history.start, history.step, _figures(pool))
            memo.end = max(0, now - span)
            self._memos[pool.name] = memo
        for index in range(memo.end, now + 1):
            self._learn(memo, pool, index, horizon, memory)
            memo.ticks[index] = self._tick(memo, pool, index, horizon)
        memo.end = max(memo.end, now + 1)
        for index in [i for i in memo.ticks if i < now - max(hold, horizon) - 1]:
            del memo.ticks[index]
        return memo.ticks

    def _tick(self, memo: _Memory, pool: model.PoolView, index: int, horizon: int) -> _Tick:
        values = memo.values
        estimate, slope = self._trend(pool, values, index, horizon)
        seasonal = self._seasonal(pool, values, index, horizon)
        floor = pool.min_serving
        last = _last_known(values, index, horizon)
        if last is not None:
            floor = max(floor, pool.need(last))
        if seasonal > 0:
            floor = max(floor, pool.need(seasonal))
        learned = memo.misses[0][1] if memo.misses else 0.0
        jumps = self._jumpiness(memo, pool, index, horizon)
        # z = 0 turns the margin off, even after a rise out of zero (0 * inf would be nan).
        jumps = self.params.jumpiness_z * jumps if self.params.jumpiness_z else 0.0
        margin = max(self.params.safety, learned, jumps)
        keep = None
        if estimate is not None:
            keep = max(floor, _need_capped(pool, estimate, margin))
        return _Tick(estimate, slope, seasonal, floor, margin, jumps, learned, keep)

    def _learn(
        self, memo: _Memory, pool: model.PoolView, index: int, horizon: int, memory: int
    ) -> None:
        """Record the margin the tick ``horizon`` steps ago would have needed, now that the
        demand over its horizon is known, and forget misses older than ``memory``."""
        misses = memo.misses
        while misses and misses[0][0] < index - memory:
            misses.popleft()
        then = memo.ticks.get(index - horizon)
        if not memory or then is None or then.estimate is None:
            return
        seen = [v for v in memo.values[index - horizon : index] if v is not None]
        if not seen:
            return
        needed = math.ceil(max(seen) / pool.rps_per_node - 1e-9)  # nodes without headroom
        if needed <= then.floor or needed <= _need_capped(pool, then.estimate, self.params.safety):
            return
        if then.estimate <= 0:
            margin = math.inf
        else:
            # need(e * (1 + m)) >= n  <=>  e * (1 + m) * (1 + headroom) / rps_per_node > n - 1
            capacity = (needed - 1) * pool.rps_per_node / (1 + pool.headroom)
            margin = capacity / then.estimate - 1 + 1e-9
        while misses and misses[-1][1] <= margin:
            misses.pop()
        misses.append((index - horizon, margin))

    def _jumpiness(self, memo: _Memory, pool: model.PoolView, index: int, horizon: int) -> float:
        """Root mean square of the log change from one horizon's mean demand to the next, over
        the last ``jumpiness_minutes``; 0 until a horizon's worth of changes is known."""
        values, changes = memo.values, memo.changes
        span = self._minutes(self.params.jumpiness_minutes, pool.history.step)
        while changes and changes[0][0] <= index - span:
            changes.popleft()
        if not changes or changes[-1][0] < index:
            later = _known(values, index - horizon, index, index)
            earlier = _known(values, index - 2 * horizon, index - horizon, index)
            if later and earlier:
                change = _squared_log_change(
                    math.fsum(earlier) / len(earlier), math.fsum(later) / len(later)
                )
                if change is not None:
                    changes.append((index, change))
        if len(changes) < horizon:
            return 0.0
        return math.sqrt(math.fsum(c for _, c in changes) / len(changes))

    # -----------------------------------------------------------------------------------------
    # The estimates, each from the history before ``index`` only.

    def _trend(
        self, pool: model.PoolView, values: Sequence[float | None], index: int, horizon: int
    ) -> tuple[float | None, float]:
        """The fitted line read at the last step, carried ``horizon`` steps on when rising.

        Only samples after the last run of missing ones at least ``return_time`` long count;
        with fewer than ``min_history_minutes`` of them the estimate is None.
        """
        step = pool.history.step
        span = self._minutes(self.params.fit_minutes, step)
        outage = self._steps(pool.return_time, step)
        lo = max(0, index - span)
        n = sx = sy = sxy = sxx = 0.0
        missing = 0
        for i in range(max(0, lo - outage), index):
            value = values[i]
            if value is None:
                missing += 1
                if missing >= outage:
                    n = sx = sy = sxy = sxx = 0.0
                continue
            missing = 0
            if i >= lo:
                x = float(i - index)  # small numbers: no loss of precision in the sums
                n += 1
                sx += x
                sy += value
                sxy += x * value
                sxx += x * x
        if missing >= outage or n < self._minutes(self.params.min_history_minutes, step):
            return None, 0.0
        mean_x, mean_y = sx / n, sy / n
        spread = sxx / n - mean_x * mean_x
        slope = (sxy / n - mean_x * mean_y) / spread if spread > 1e-12 else 0.0
        level = mean_y + slope * (-1.0 - mean_x)  # the line at the last step, x = -1
        return max(0.0, level + max(slope, 0.0) * horizon), slope

    def _seasonal(
        self, pool: model.PoolView, values: Sequence[float | None], index: int, horizon: int
    ) -> float:
        """Median over previous days of their peak over the horizon, scaled to today's level."""
        p, step = self.params, pool.history.step
        hour, day = self._steps(HOUR, step), self._steps(DAY, step)
        reach = horizon + self._minutes(p.seasonal_slack_minutes, step)
        today = _known(values, index - hour, index, index)
        if not today:
            return 0.0
        level = math.fsum(today) / len(today)
        predictions = []
        for days_back in range(1, p.days + 1):
            then = index - days_back * day
            if then - hour < 0:
                break
            before = _known(values, then - hour, then, index)
            ahead = _known(values, then, then + reach, index)
            if before and ahead:
                base = math.fsum(before) / len(before)
                if base > 0:
                    predictions.append(max(ahead) * level / base)
        return statistics.median(predictions) if predictions else 0.0

    @staticmethod
    def _steps(span: timedelta, step: timedelta) -> int:
        return max(1, math.ceil(span / step - 1e-9))

    @classmethod
    def _minutes(cls, minutes: int, step: timedelta) -> int:
        return cls._steps(timedelta(minutes=minutes), step) if minutes else 0


def _margin_text(margin: float) -> str:
    return f"{margin:.2f}" if math.isfinite(margin) else "unbounded"


def _figures(pool: model.PoolView) -> tuple[float, float, int, int, timedelta]:
    return (pool.rps_per_node, pool.headroom, pool.min_serving, pool.size, pool.return_time)


def _squared_log_change(before: float, after: float) -> float | None:
    """The squared log change from one horizon's mean demand, ``before``, to the next.

    Zero after zero is no change. A rise out of zero is larger than any ratio: infinite, so
    the margin is unbounded until it leaves the jumpiness span, as the learned margin is after
    a miss on an estimate of zero; nothing can size such a rise, so it never counts as calm.
    A fall to zero is not measured (None): the rise out of it will be.
    """
    if before > 0:
        ratio = after / before
        return math.log(ratio) ** 2 if ratio > 0 else None
    return 0.0 if after <= 0 else math.inf


def _known(values: Sequence[float | None], lo: int, hi: int, end: int) -> list[float]:
    """Known values of ``[lo, hi)``, never at or past ``end`` (what the tick could see)."""
    # Both bounds clipped at 0: a negative ``hi`` would slice from the end of ``values``,
    # which is the future when the series runs past ``end`` (as the simulator's does).
    return [v for v in values[max(0, lo) : max(0, min(hi, end))] if v is not None]


def _last_known(values: Sequence[float | None], index: int, within: int) -> float | None:
    for i in range(index - 1, max(-1, index - 1 - within), -1):
        value = values[i]
        if value is not None:
            return value
    return None


def _need_capped(pool: model.PoolView, rps: float, margin: float) -> int:
    """Nodes for ``rps * (1 + margin)`` with headroom; the whole pool when that is unbounded."""
    wanted = rps * (1.0 + margin)
    if not math.isfinite(wanted) or wanted * (1 + pool.headroom) >= pool.size * pool.rps_per_node:
        return pool.size
    return pool.need(wanted)


PLUGIN = strategy.Plugin(
    Params, Forecast, "keep what demand may reach before a reclaimed node is warm"
)
