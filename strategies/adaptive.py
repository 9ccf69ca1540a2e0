"""Follow the best of a ladder of ``peak`` rules, judged on this pool's own history.

Each rung of the ladder is a ``peak`` rule (keep what the largest demand of the last ``w``
minutes needs, with a margin ``k``): ``windows`` x ``margins``, margins no smaller than
``least_margin``. With ``traffic_windows`` every rung also comes with a window over its last
``w`` steps *with traffic*, so that a stretch of exact zeros or a gap does not empty it. The
margins reach 2, as the ``peak`` grid the default is judged against does: a service whose
spikes reach 2-4 times its level within minutes is ridden out by a short window with such a
margin, and a ladder that stopped at 1 could only ride them out on a window long enough to
remember the last spike, which keeps that spike's level all day.

Every rung is replayed, minute by minute, from the demand history through a small model of the
planner (the limits it will meet, ``PoolView.limits``): strategy lends and reclaims at most
``max_step_fraction`` of the pool per tick; a node lent only from warm serving nodes above what
the last sample needs with headroom, and not within ``cooldown`` of coming back; a safety
reclaim at once when demand needs more than serves and returns; every loan taken back once
demand has been unknown for ``metrics_grace``; nothing lent while a fast fall is held
(``core.demand``); a reclaimed node warm again ``return_time`` later. That gives each rung the
node-hours it would have lent and the minutes its warm capacity would have been below demand
over the last ``memory_minutes``, and the pool keeps what the rung with the best score keeps:

    lent node-hours - price x breach minutes,    price = price_pool_hours x pool size

Ties go to the rung listed first (shorter windows, smaller margins).

The answer holds a loan for the drain: a reclaim follows what is kept now, a loan needs the
most the pool's answers kept over the last ``drain + 1`` minutes (3 by default). A keep that
rose and fell within minutes (a sample near a node's boundary) otherwise lends a node while the
one taken back for the rise still drains, and takes it back a minute later: a training restart
for nothing, and, while the first node warms, a breach (the demo's one breach minute with the
default pool; on the Azure ``code`` week, 204 reclaims instead of 241 for 0.9454 harvest
instead of 0.9499, both with no breach minute). The replay scores the rungs as the ``peak``
rules they are, without it: held in the replay too, the short rungs' flaps disappear from
their scores but not from the pool, and on the jumpy scenarios the rule breached 8 minutes
more (m-large 32 against 24).

Why it should hold on a service it was not tuned on: a smooth service shows no miss on any
rung, so the most lucrative rung, the shortest window with the least margin, is followed all
along; a jumpy one shows misses on the short windows after its jumps, so the rule moves to the
window and margin that would have ridden them out, and stays there while the lending that costs
is less than the misses it avoids. A miss every rung shares (a first-of-a-kind jump nothing
recent foresaw) changes no rung's rank, so it moves nothing. What it cannot avoid: the misses
that teach it. A jumpy service's first jumps breach on the short rung it starts on.

With an error budget (``PoolView.budget``) the price rises as it burns, ``price x (1 +
budget_gain x burned)``: twice the price once it is spent, so the rule moves to wider rungs
sooner. (A budget that cannot pay for another loan also leaves only covered loans in the
planner, whatever a strategy says: docs/design/budget.md.)

Figures (``bench/robustness.py``, docs/design/budget.md): the Azure ``code`` week 0.945
harvest with 0 breach minutes and 204 reclaims (the oracle's: 268), ``conv`` 0.820 with 1.
Without a budget it is dominated by the peak grid on 12 of the suite's 23 scenarios (a grid
point with the same harvest within 0.01 and fewer breach minutes), by the misses that teach it
(on the jumpy ones; on a growing smooth one, the days on a wider margin after a one-minute
miss); with the default budget every rolling week kept it, on all 23.

The replay is kept per pool and goes on from where the last history read ended, so a tick
costs one step per rung for the minutes that are new: a history read that continues the last
(the controller reads one every 5 minutes, its start sliding forward) goes on; another pool
figure, another grid or a step back in time rebuilds it from that history alone (about 2 s for
14 days). Each rung's lent node-hours and breach minutes are tallied in hourly buckets over the
memory, so what a pool keeps does not grow with its history (``bench/strategy_cpu.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar

import pydantic

from rebalancer.core import model, strategy

Steps = deque[tuple[int, float]]  # a window's running maximum: (step, value), values falling
_BUCKET = timedelta(hours=1)  # what the rungs' scores are tallied in
_KEEPS = 4096  # (peak, margin) keeps a replay remembers


class Params(strategy.Params):
    windows: tuple[pydantic.PositiveInt, ...] = pydantic.Field(
        default=(10, 30, 60, 120, 240, 480),
        min_length=1,
        description="the ladder's peak windows, minutes",
    )
    margins: tuple[pydantic.NonNegativeFloat, ...] = pydantic.Field(
        default=(0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0),
        min_length=1,
        description="the ladder's margins on the window's peak",
    )
    least_margin: float = pydantic.Field(
        default=0.1, ge=0, le=5, description="margins below this are left out of the ladder"
    )
    price_pool_hours: float = pydantic.Field(
        default=1.0,
        ge=0,
        le=1000,
        description="what one breach minute costs, in hours of the whole pool lent",
    )
    memory_minutes: int = pydantic.Field(
        default=14 * 24 * 60, ge=60, le=28 * 24 * 60, description="span the rungs are scored on"
    )
    traffic_windows: bool = pydantic.Field(
        default=True,
        description="also ladder every rung with a window over its last w steps with traffic",
    )
    budget_gain: float = pydantic.Field(
        default=1.0, ge=0, le=100, description="with a budget: the price's rise as it burns"
    )

    @pydantic.model_validator(mode="after")
    def _a_rung_at_least(self) -> Params:
        if max(self.margins) < self.least_margin:
            raise ValueError(
                f"no margin in {list(self.margins)} reaches least_margin={self.least_margin}"
            )
        return self


@dataclass
class _Tally:
    """A count over the trailing span, kept in buckets of ``_BUCKET`` so that what a pool
    remembers does not grow with its history: the buckets the span holds, plus the one being
    filled."""

    buckets: deque[int] = field(default_factory=deque)
    total: int = 0  # over ``buckets``
    filling: int = 0

    def add(self, count: int) -> None:
        self.filling += count

    def close(self, keep: int) -> None:
        """The bucket being filled is done; keep the last ``keep`` buckets."""
        self.buckets.append(self.filling)
        self.total += self.filling
        self.filling = 0
        while len(self.buckets) > keep:
            self.total -= self.buckets.popleft()

    @property
    def value(self) -> int:
        return self.total + self.filling


@dataclass
class _Rung:
    window: int  # steps
    margin: float
    traffic: bool  # the window counts only steps with traffic (demand above zero)
    lent: int = 0
    returning: deque[int] = field(default_factory=deque)  # the step each is warm again
    cooling: deque[int] = field(default_factory=deque)  # the step each may be lent again
    serving_after: int = 0  # warm serving nodes after the last step's moves
    keep: int = 0  # nodes the rung kept serving at the last step
    lent_steps: _Tally = field(default_factory=_Tally)  # lent node-steps
    missed: _Tally = field(default_factory=_Tally)  # breach minutes


@dataclass
class Memory:
    start: datetime  # index 0 of the grid the replay counts steps on
    step: timedelta
    figures: tuple[object, ...]
    first: int  # the step the replay began at
    end: int  # steps before ``end`` are replayed
    rungs: list[_Rung]
    maxes: dict[int, Steps]  # per window, over every step
    busy: dict[int, Steps]  # per window, over the steps with traffic only
    bucket: int  # steps per bucket of the rungs' tallies
    buckets: int  # buckets the tallies keep: the span the rungs are scored on
    moves: _Moves  # the planner's limits in steps of the grid
    busy_count: int = 0  # steps with traffic seen
    unknown: int = 0  # consecutive steps without a sample
    level: float | None = None  # the last believed sample (the drop hold's level)
    held_since: int | None = None  # a fall too fast to believe, seen first at this step
    # With busy windows, the second half of ``rungs`` are the busy rungs: ``rungs[i + twins]``
    # is ``rungs[i]`` itself (the same object) until their windows' tops first differ.
    twins: int = 0
    shared: int = 0  # busy rungs that are still their twin
    live: list[_Rung] = field(default_factory=list)  # ``rungs``, each object once (``_live``)
    keeps: dict[tuple[float, float], int] = field(default_factory=dict)  # ``_kept``

    def offset(self, pool: model.PoolView) -> int | None:
        """Where ``pool.history`` starts on the replay's grid, if the replay can go on with it:
        the same pool figures, the same grid, and the step before ``end`` still in it (a new
        history read continues the last; a step back in time or a gap does not)."""
        history = pool.history
        if self.figures != _figures(pool) or self.step != history.step:
            return None
        shift = (history.start - self.start) / history.step
        if shift != int(shift):
            return None
        offset = int(shift)
        if not offset <= max(0, self.end - 1) <= offset + history.end_index:
            return None
        return offset


class Adaptive:
    name: ClassVar[str] = "adaptive"
    reads_history: ClassVar[bool] = True

    def __init__(self, params: Params) -> None:
        self.params = params
        self._memos: dict[model.PoolName, Memory] = {}
        # Per pool, what each answer kept and when: a loan needs the most of the hold span (the
        # replay's own keeps lag the live sample by the history's refresh).
        self._kept: dict[model.PoolName, deque[tuple[datetime, int]]] = {}

    def decide(self, pool: model.PoolView) -> model.Proposal:
        if pool.demand is None:
            return model.Proposal(pool.lent, "adaptive: demand unknown, holding")
        memo = self._advance(pool)
        best, score, misses = self._choose(memo, pool)
        rung = memo.rungs[best]
        keep = max(rung.keep, _keep(pool, pool.demand.value, rung.margin))
        # A reclaim follows the keep of now; a loan needs the most kept while a node taken back
        # for the same rise may still drain, so that a keep that rose and fell within minutes
        # (the noise of a sample near a node's boundary) lends nothing it must take back.
        held = self._held(pool, keep)
        target = min(max(pool.lent, pool.size - held), pool.size - keep)
        busy = "busy " if rung.traffic else ""
        return model.Proposal(
            max(0, target),
            f"adaptive: peak over the last {rung.window} {busy}steps +{rung.margin:.0%} (best "
            f"of {len(memo.rungs)} rules over the trailing span), keeps {keep}",
            {
                "window_steps": rung.window,
                "busy_window": "yes" if rung.traffic else "no",
                "margin": rung.margin,
                "keep": keep,
                "score_node_hours": score,
                "replayed_breach_minutes": misses,
            },
        )

    def _held(self, pool: model.PoolView, keep: int) -> int:
        """The most this pool's answers kept over the hold span, ``keep`` now included."""
        kept = self._kept.setdefault(pool.name, deque())
        since = pool.now - _hold_span(pool)
        while kept and kept[-1][0] > pool.now:  # a step back in time
            kept.pop()
        while kept and kept[0][0] <= since:
            kept.popleft()
        kept.append((pool.now, keep))
        return max(k for _, k in kept)

    def _choose(self, memo: Memory, pool: model.PoolView) -> tuple[int, float, int]:
        """The best rung over the trailing span: (its index, its score, its misses)."""
        p, step = self.params, pool.history.step
        price = p.price_pool_hours * pool.size
        if pool.budget is not None:
            price *= 1.0 + p.budget_gain * min(1.0, pool.budget.burned)
        per_hour = timedelta(hours=1) / step
        best, best_score, best_misses = 0, -math.inf, 0
        # While every busy rung is its plain twin, the busy half scores what the plain half
        # did, and a tie goes to the first: the plain half alone gives the same best.
        ladder = memo.rungs[: memo.twins] if memo.shared == memo.twins > 0 else memo.rungs
        for index, rung in enumerate(ladder):
            missed, lent = rung.missed, rung.lent_steps  # ``_Tally.value``, without a call each
            misses = missed.total + missed.filling
            score = (lent.total + lent.filling) / per_hour - price * misses
            if score > best_score:
                best, best_score, best_misses = index, score, misses
        return best, best_score, best_misses

    def _advance(self, pool: model.PoolView) -> Memory:
        """The replay brought up to the end of ``pool.history``: where the last history read
        left off, when this one continues it (the controller reads a new one every few
        minutes), so that a tick costs the steps that are new; from this history alone when it
        does not."""
        history = pool.history
        span = _steps(timedelta(minutes=self.params.memory_minutes), history.step)
        memo = self._memos.get(pool.name)
        offset = None if memo is None else memo.offset(pool)
        if memo is None or offset is None or offset + history.end_index - memo.end > span:
            memo = self._memos[pool.name] = self._fresh(pool, span)
            offset = 0
        now = offset + history.end_index
        values = history.values
        for tick in range(memo.end, now + 1):
            last = values[tick - 1 - offset] if tick > offset else None
            self._replay(memo, pool, tick, last)
        memo.end = max(memo.end, now + 1)
        return memo

    def _fresh(self, pool: model.PoolView, span: int) -> Memory:
        p, history = self.params, pool.history
        step = history.step
        longest = max(_steps(timedelta(minutes=w), step) for w in p.windows)
        first = max(0, history.end_index - span - longest)
        rungs = [
            _Rung(_steps(timedelta(minutes=w), step), k, False, serving_after=pool.size)
            for w in p.windows
            for k in sorted(p.margins)
            if k >= p.least_margin - 1e-9
        ]
        twins = len(rungs) if p.traffic_windows else 0
        rungs += rungs[:twins]  # the busy rungs: each its plain twin until they part (_live)
        windows = {r.window for r in rungs}
        bucket = _steps(_BUCKET, step)
        return Memory(
            start=history.start,
            step=step,
            figures=_figures(pool),
            first=first,
            end=first,
            rungs=rungs,
            maxes={w: deque() for w in windows},
            busy={w: deque() for w in windows},
            bucket=bucket,
            buckets=math.ceil(span / bucket),
            twins=twins,
            shared=twins,
            live=rungs[: len(rungs) - twins],
            moves=_Moves.of(pool, step),
        )

    def _replay(self, memo: Memory, pool: model.PoolView, tick: int, last: float | None) -> None:
        """One step of every rung: score the minute before ``tick`` (``last``) against what the
        rung had warm, then move the rung's nodes as the planner would at ``tick``."""
        _slide(memo, last, tick)
        memo.unknown = memo.unknown + 1 if last is None and tick > 0 else 0
        held = _hold(memo, pool, last, tick)
        moves = memo.moves
        lost = memo.unknown >= moves.grace
        believed = memo.level if held else last
        need_now = None if believed is None else pool.need(believed)
        scored = last if last is not None and tick > memo.first else None
        size, rps_per_node, per_tick = pool.size, pool.rps_per_node, moves.per_tick
        closing = (tick + 1) % memo.bucket == 0
        tops = None if need_now is None else _tops(memo, believed or 0.0)
        for rung in _live(memo, tops):
            missed = scored is not None and scored > rps_per_node * rung.serving_after + 1e-9
            returning, cooling = rung.returning, rung.cooling
            while returning and returning[0] <= tick:
                returning.popleft()
            while cooling and cooling[0] <= tick:
                cooling.popleft()
            lent = rung.lent
            if tops is None:
                keep = size - lent  # demand unknown: the planner lends nothing more
            else:
                keep = _kept(memo, pool, tops[rung.traffic, rung.window], rung.margin)
            rung.keep = keep
            if lost and lent:
                lent = moves.reclaim(rung, lent, tick)
            if need_now is not None and lent and need_now > size - lent:
                # serving and returning count
                lent = moves.reclaim(rung, min(need_now - (size - lent), lent), tick)
            target = size - keep if keep < size else 0
            if target < lent:
                lent = moves.reclaim(rung, min(lent - target, per_tick), tick)
            elif target > lent and need_now is not None and not held:
                serving = size - lent - len(returning)
                # Warm nodes back from a loan within the cooldown are not lent again.
                cool = len(cooling) - len(returning)
                lendable = serving - cool if cool > 0 else serving
                floor = pool.min_serving if pool.min_serving > need_now else need_now
                room = min(serving - floor, lendable, target - lent, per_tick)
                if room > 0:
                    lent += room
                    rung.lent = lent
            rung.serving_after = size - lent - len(returning)
            rung.lent_steps.filling += lent  # ``_Tally.add``, without a call per rung
            rung.missed.filling += missed
            if closing:
                rung.lent_steps.close(memo.buckets)
                rung.missed.close(memo.buckets)


@dataclass(frozen=True)
class _Moves:
    """The planner's limits in steps of the replay's grid, fixed with the pool's figures: a
    replayed reclaim is warm again ``back`` steps later and lendable again ``cooldown`` after
    its drain ends; strategy moves are at most ``per_tick`` nodes; every loan is taken back
    once demand has been unknown ``grace`` steps."""

    back: int
    drain: int
    cooldown: int
    per_tick: int
    grace: int

    @classmethod
    def of(cls, pool: model.PoolView, step: timedelta) -> _Moves:
        limits = pool.limits
        back = _steps(pool.return_time, step)
        return cls(
            back=back,
            drain=min(back, _steps(limits.drain, step)),
            cooldown=_steps(limits.cooldown, step) if limits.cooldown else 0,
            per_tick=max(1, math.ceil(limits.max_step_fraction * pool.size)),
            grace=_steps(limits.metrics_grace, step),
        )

    def reclaim(self, rung: _Rung, count: int, tick: int) -> int:
        """Take ``count`` of ``rung``'s loans back at ``tick``; what it has lent after."""
        if count > 0:
            rung.lent -= count
            warm, cool = tick + self.back, tick + self.drain + self.cooldown
            for _ in range(count):
                rung.returning.append(warm)
                rung.cooling.append(cool)
        return rung.lent


def _slide(memo: Memory, last: float | None, tick: int) -> None:
    """The running window maxima over the steps before ``tick``, with ``last`` the newest."""
    if last is not None:
        for maxima in memo.maxes.values():
            _push(maxima, tick - 1, last)
    for w, maxima in memo.maxes.items():
        while maxima and maxima[0][0] < tick - w:
            maxima.popleft()
    if last is not None and last > 0:
        memo.busy_count += 1
        for w, maxima in memo.busy.items():
            _push(maxima, memo.busy_count, last)
            while maxima and maxima[0][0] <= memo.busy_count - w:
                maxima.popleft()


def _live(memo: Memory, tops: dict[tuple[bool, int], float] | None) -> list[_Rung]:
    """The rungs to step at this step, each once. A busy rung and its plain twin (same window,
    same margin) start alike, and a rung's step reads ``traffic`` only to pick its window's
    top: while the two tops are equal (or unread, demand unknown) the twins stay alike, so one
    object stands for both; it is copied into a busy rung of its own at the first step the
    tops differ, before that step. ``_choose`` sees the same scores at the same places (the
    plain twin, listed first, wins their tie as before), and a ladder whose every step had
    traffic steps half its rungs."""
    if not memo.shared or tops is None:
        return memo.live
    parting = {w for (busy, w), top in tops.items() if busy and top != tops[False, w]}
    if parting:
        rungs, twins = memo.rungs, memo.twins
        for i in range(twins, 2 * twins):
            rung = rungs[i]
            if rung.window in parting and rung is rungs[i - twins]:
                rungs[i] = dataclasses.replace(copy.deepcopy(rung), traffic=True)
                memo.shared -= 1
        memo.live = list({id(r): r for r in rungs}.values())
    return memo.live


def _tops(memo: Memory, floor: float) -> dict[tuple[bool, int], float]:
    """Per (busy or not, window): the largest of ``floor`` and the window's peak, worked out
    once per step for the rungs that share it."""
    tops = {}
    for traffic, windows in ((False, memo.maxes), (True, memo.busy)):
        for w, maxima in windows.items():
            tops[traffic, w] = max(floor, maxima[0][1] if maxima else 0.0)
    return tops


def _push(maxima: Steps, at: int, value: float) -> None:
    while maxima and maxima[-1][1] <= value:
        maxima.pop()
    maxima.append((at, value))


def _hold(memo: Memory, pool: model.PoolView, last: float | None, tick: int) -> bool:
    """The planner's drop hold (``core.demand``): a fall below ``drop_floor`` of the last
    believed sample, by a node's worth or more, is not believed (nothing is lent, the level is
    planned with) until it has lasted ``drop_hold``."""
    if last is None:
        return memo.held_since is not None
    limits, level = pool.limits, memo.level
    if level is not None and last < limits.drop_floor * level and level - last >= pool.rps_per_node:
        if memo.held_since is None:
            memo.held_since = tick
        if tick - memo.held_since < _steps(limits.drop_hold, memo.step):
            return True
    memo.level, memo.held_since = last, None
    return False


def _kept(memo: Memory, pool: model.PoolView, rps: float, margin: float) -> int:
    """``_keep``, remembered per (peak, margin) for the memo's life: a window's peak stays for
    many steps and the pool's figures are the memo's own, so the same keep is asked again and
    again. Bounded: forgotten whole past ``_KEEPS``."""
    keeps = memo.keeps
    known = keeps.get((rps, margin))
    if known is None:
        if len(keeps) >= _KEEPS:
            keeps.clear()
        known = keeps[rps, margin] = _keep(pool, rps, margin)
    return known


def _keep(pool: model.PoolView, rps: float, margin: float) -> int:
    wanted = rps * (1.0 + margin)
    if wanted * (1 + pool.headroom) >= pool.size * pool.rps_per_node:
        return pool.size
    return pool.need(wanted)


def _hold_span(pool: model.PoolView) -> timedelta:
    """How long a keep holds for a loan: while a node taken back for it drains, and the minute
    its decision read."""
    return pool.limits.drain + timedelta(minutes=1)


def _steps(span: timedelta, step: timedelta) -> int:
    return max(1, math.ceil(span / step - 1e-9))


def _figures(pool: model.PoolView) -> tuple[object, ...]:
    return (
        pool.rps_per_node,
        pool.headroom,
        pool.min_serving,
        pool.size,
        pool.return_time,
        pool.limits,
    )


PLUGIN = strategy.Plugin(
    Params, Adaptive, "follow the peak rule that would have served this pool best"
)
