"""What a pool's own history says its loans are exposed to: the cover of an error budget.

Where it sits: before the planner. The controller and the simulator keep one ``Jumps`` per pool
with an error budget, hand it each demand history they read, and put the ``Cover`` it answers
in the pool's snapshot; the planner (``core.planning``) uses it once the budget cannot pay for
another loan's worst case (docs/design/budget.md).

Why: a loan costs the budget only when demand jumps, within one loan's risk (the minute a jump
is seen plus a reclaimed node's return time), beyond what the serving nodes carry. How far
demand has jumped within that time, over the recent peak, is something the pool's history
shows. For a peak window ``w`` (120 minutes) and every minute ``t`` of the kept history:

    jump_w(t) = max demand over [t, t + risk) / peak_w(t)

where ``peak_w(t)`` is the most demand of the last ``w`` minutes with traffic before ``t``.

The largest ``jump_w`` over the span is the margin the history says was never exceeded within
one return time; it is a sample, so the cover takes it a tenth larger in log terms (``stretch``:
sparse bursts on a base of 3 % of their peak showed 26.6x in three days, then 33x). A second
figure covers what a ratio cannot: the most demand the coming minutes brought at this time of
day on each of the last days (a holiday's quiet ends with a return to the usual level, a jump
far beyond anything relative to the quiet peak). Warm serving nodes that carry the larger of
``peak_w(now) x jump_w`` and that daily level, with the pool's headroom on top (the planner adds
it), would have ridden out every jump the span holds: the loans that leave them serving are
*covered*. A loan beyond that is *exposed*: a jump like one already seen could reach it, and
the budget pays for it.

Why a 120-minute window, and only that one: each window's cover holds in hindsight on its own,
and the least over 10, 30, 60 and 120 minutes is the most lent; but a short window's peak
forgets the level a jumpy service left minutes ago, and on the suite (docs/design/budget.md)
the least over the four breached in covered mode and overspent a 10-minute budget (m-small:
16 minutes in a week), where the 120-minute window alone kept it.

A window counts only minutes with traffic, however long ago they were. A stretch of exact
zeros (a service with no clients for hours, a GPU series with nothing running) is no level to
jump from: what comes after it is a return to the level the service left, or to the one the days
show at this hour, and is judged against those. Counted as a jump out of a peak of zero, it had
no finite ratio, and one return left the pool with no cover for the whole span: on the suite,
``zeros-code`` lent 0.282 of the oracle with a 10-minute budget, now 0.743
(docs/design/budget.md).

Minutes whose coming demand the pool's minimum serving nodes carry anyway teach nothing and are
skipped. The cover is judged only on ``least_judged`` of history with traffic behind it or
more: a short history has not shown the pool's jumps yet, and no cover means no covered loans.

``Jumps`` is incremental: each history it is handed continues where the last one ended (the
controller reads a new history object every few minutes; the simulator one a minute, longer by
one). Minutes already judged are not judged again, so a tick costs the minutes that are new.
A history that does not continue the last (another grid, a gap, a step back in time) starts
the judgement again from that history alone.

Pure in result: the same history gives the same cover, however it arrived.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice

from rebalancer.core import model
from rebalancer.core.policy import PoolPolicy

WINDOWS = (timedelta(minutes=120),)
SPAN = timedelta(days=8)  # the history a cover is judged on: what the controller keeps
LEAST_JUDGED = timedelta(days=1)  # less than this has not shown the pool's jumps yet

_Maxima = deque[tuple[int, float]]  # a running maximum: (index, value), values falling


@dataclass(frozen=True)
class Shape:
    """What a ``Jumps`` judges with: the pool's figures that set the cover."""

    risk: timedelta  # one loan's worst case: the minute a jump is seen plus the return time
    floor: float  # demand the minimum serving nodes carry: jumps to it or below do not count
    windows: tuple[timedelta, ...] = WINDOWS
    span: timedelta = SPAN
    least_judged: timedelta = LEAST_JUDGED
    days: int = 7  # the last days whose level at this hour the cover keeps (at least one)
    # The largest jump of a span is a sample: the next span's may be larger. The cover takes it
    # raised to ``1 + stretch`` (a tenth more in log terms: 1.5 -> 1.56, 26.6 -> 36.9).
    stretch: float = 0.1


def shape_of(policy: PoolPolicy) -> Shape:
    """How a pool's cover is judged: over one loan's risk, leaving out the jumps its minimum
    serving nodes carry anyway."""
    return Shape(
        risk=timedelta(minutes=policy.loan_risk_minutes),
        floor=policy.rps_per_node * policy.min_serving,
    )


class Jumps:
    """The largest jump of demand within one loan's risk, per peak window, over the span."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self._grid: tuple[datetime, timedelta] | None = None  # the first history's start, step
        self._next = 0  # the next index (on that grid) to read
        self._windows: tuple[int, ...] = ()
        self._risk = 1
        self._span = 1
        self._ahead: _Maxima = deque()  # demand over [t, t + risk)
        self._behind: list[_Maxima] = []  # per window: ``peak_w(t)``, keyed by ``_busy``
        self._jumps: list[_Maxima] = []  # per window: jump_w(t) over the span
        self._judged = 0  # minutes judged since the start
        self._busy = 0  # minutes with traffic before the judged minute, since the start
        self._newest: deque[float] = deque()  # the newest values with traffic, a window's worth
        # The last ``days`` of values (and up to as many again, trimmed in one go): a list, so
        # that the minutes of one time of day are a slice away.
        self._days: list[float | None] = []
        self._day = 1

    def cover(self, history: model.DemandHistory) -> model.Cover | None:
        """The cover at the end of ``history``, or None while too little has been judged."""
        self._read(history)
        judged = min(self._judged, self._span)
        if judged * history.step < self.shape.least_judged:
            return None
        return model.Cover(
            jumps=tuple(
                model.Jump(
                    window=window,
                    peak=max(islice(reversed(self._newest), steps), default=None),
                    ratio=seen ** (1.0 + self.shape.stretch),
                    seen=seen,
                )
                for window, steps, seen in zip(
                    self.shape.windows, self._windows, self._largest(), strict=True
                )
            ),
            judged=history.step * judged,
            usual=self._usual(),
        )

    def _largest(self) -> list[float]:
        """Per window, the largest jump over the span (1 where none counted)."""
        return [max(1.0, jumps[0][1]) if jumps else 1.0 for jumps in self._jumps]

    def _usual(self) -> float | None:
        """The most demand the minutes ahead (one loan's risk) brought at this time of day,
        over the last ``days``."""
        values, day = self._days, self._day
        seen = []
        for back in range(1, self.shape.days + 1):
            lo = len(values) - back * day
            if lo < 0:
                break
            peak = _peak(values[lo : lo + self._risk])
            if peak is not None:
                seen.append(peak)
        return max(seen) if seen else None

    def _read(self, history: model.DemandHistory) -> None:
        offset = self._offset(history)
        if offset is None or not offset <= self._next <= offset + history.end_index:
            self._restart(history)
            offset = 0
        for index in range(self._next, offset + history.end_index):
            self._push(index, history.values[index - offset])
        self._next = max(self._next, offset + history.end_index)

    def _offset(self, history: model.DemandHistory) -> int | None:
        """Where ``history`` starts on the grid of the first one, if it lies on that grid and
        reaches back far enough to continue where the last one ended."""
        if self._grid is None or self._grid[1] != history.step:
            return None
        shift = (history.start - self._grid[0]) / history.step
        if shift != int(shift):
            return None
        return int(shift)

    def _restart(self, history: model.DemandHistory) -> None:
        step, shape = history.step, self.shape
        self._grid = (history.start, step)
        self._windows = tuple(_steps(w, step) for w in shape.windows)
        self._risk = _steps(shape.risk, step)
        self._span = _steps(shape.span, step)
        self._ahead = deque()
        self._behind = [deque() for _ in self._windows]
        self._jumps = [deque() for _ in self._windows]
        self._next = max(0, history.end_index - self._span - max(self._windows) - self._risk)
        self._judged = 0
        self._busy = 0
        self._newest = deque(maxlen=max(self._windows))
        self._day = _steps(timedelta(days=1), step)
        self._days = []

    def _push(self, index: int, value: float | None) -> None:
        """Read the value at ``index``: the minute ``t = index - risk + 1`` now has all of its
        coming demand known, so its jumps are judged."""
        self._days.append(value)
        if len(self._days) > 2 * self._day * self.shape.days:
            del self._days[: -self._day * self.shape.days]
        if value is not None:
            _add(self._ahead, index, value)
            if value > 0:
                self._newest.append(value)
        t = index - self._risk + 1
        _expire(self._ahead, t)
        before = self._days[-self._risk - 1] if len(self._days) > self._risk else None
        traffic = before if before is not None and before > 0 else None  # demand at t - 1
        self._busy += traffic is not None
        for steps, behind, jumps in zip(self._windows, self._behind, self._jumps, strict=True):
            if traffic is not None:
                _add(behind, self._busy, traffic)
            _expire(behind, self._busy - steps + 1)
            _expire(jumps, t - self._span + 1)
            coming = self._ahead[0][1] if self._ahead else None
            if coming is None or coming <= self.shape.floor or not behind:
                continue
            _add(jumps, t, coming / behind[0][1])
        self._judged += self._busy > 0


def _add(maxima: _Maxima, index: int, value: float) -> None:
    while maxima and maxima[-1][1] <= value:
        maxima.pop()
    maxima.append((index, value))


def _expire(maxima: _Maxima, first: int) -> None:
    """Drop what lies before index ``first``."""
    while maxima and maxima[0][0] < first:
        maxima.popleft()


def _peak(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _steps(span: timedelta, step: timedelta) -> int:
    return max(1, math.ceil(span / step - 1e-9))
