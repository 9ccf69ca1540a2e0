"""What the controller believes about a pool's demand, from one read to the next.

Where it sits: each tick the runtime (and the simulator, minute by minute) hands the sample the
metrics adapter read to ``judge`` together with the belief of the previous tick, keeps the new
belief, and puts the ``Reading`` into the pool's ``PoolSnapshot``. Pure: time, state and limits
are arguments; the caller holds the state.

Why it exists: the planner keeps no memory between ticks, but two safety rules need one
(docs/design/safety-rules.md):

- **Unknown is one thing.** Prometheus unreachable, an empty result, a NaN or an infinity all
  mean "no sample this time". The belief keeps the last good sample, so demand is unknown
  *since that sample*, exactly as when Prometheus answers with an old sample: no new loans at
  once, reclaims after the grace. Before any sample at all, demand is unknown since the belief
  was made (the controller's start), so a restart while Prometheus is down reclaims after the
  grace, not on the first tick.
- **An implausible fall is not believed at once.** Serving traffic does not fall from its daily
  level to nothing in a minute; an exporter restart, a counter reset, a ``rate()`` over a young
  series or a load-balancer change does. The *level* is the highest sample believed over the
  minute before the new one (or the last believed sample, after a gap). A sample below
  ``drop_floor`` times the level, and at least one node's worth of requests below it, is
  *held*: the planner plans with the level and lends nothing. Judging against the minute's
  highest, not the previous sample, catches a collapse in many small steps as surely as one in
  a single step. The hold ends when a sample is back within ``drop_floor`` of the level (the
  fall was a blip) or when the fall has lasted ``drop_hold`` (it is real: believed from then
  on). Rises are always believed at once: they can only make the controller reclaim sooner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from rebalancer.core import model

SPAN = timedelta(minutes=1)  # how far back the level of a new sample is looked for


@dataclass(frozen=True, slots=True)
class DropRule:
    """How fast demand may plausibly fall (defaults: docs/design/safety-rules.md)."""

    floor: float = 1 / 3  # the least share of the last minute's level a sample may fall to
    hold: timedelta = timedelta(minutes=10)  # a fall lasting this long is believed
    rps_per_node: float = 0.0  # falls smaller than one node's worth are always believed

    def __post_init__(self) -> None:
        if not 0 <= self.floor <= 1:
            raise ValueError(f"drop floor must be in [0, 1], got {self.floor}")


@dataclass(frozen=True, slots=True)
class Belief:
    """One pool's demand as believed after the last tick."""

    started: datetime  # when the controller began to look: unknown since then, before a sample
    level: model.Sample | None = None  # the newest believed sample
    recent: tuple[model.Sample, ...] = ()  # believed samples of the last SPAN, oldest first
    held: model.DropHeld | None = None


@dataclass(frozen=True, slots=True)
class Reading:
    """What one tick plans with (copied into ``PoolSnapshot``)."""

    demand: model.Sample | None
    known: bool
    unknown_since: datetime | None
    held: model.DropHeld | None


def start(now: datetime) -> Belief:
    return Belief(started=now)


def usable(sample: model.Sample | None) -> model.Sample | None:
    """A sample that is a rate (finite, >= 0), else None: NaN is no sample, never a load."""
    if sample is None or not (math.isfinite(sample.value) and sample.value >= 0):
        return None
    return sample


def judge(
    belief: Belief, seen: model.Sample | None, now: datetime, rule: DropRule
) -> tuple[Belief, Reading]:
    """The new belief after reading ``seen`` at ``now``, and what the planner sees."""
    seen = usable(seen)
    level = belief.level
    if seen is None:
        # Unknown since the last good sample (or since the start): the planner ages it.
        reading = Reading(level, False, None if level else belief.started, belief.held)
        return belief, reading
    if level is None:
        return _believed(belief, seen, ()), Reading(seen, True, None, None)
    if seen.at < level.at:
        # Older than what is believed (a restarted adapter, clock skew): keep the belief.
        demand = level if belief.held is None else model.Sample(belief.held.level.value, level.at)
        return belief, Reading(demand, True, None, belief.held)
    top = belief.held.level if belief.held is not None else _level(belief, seen)
    if not _implausible(top, seen, rule):
        return _believed(belief, seen, belief.recent), Reading(seen, True, None, None)
    since = belief.held.since if belief.held is not None else now
    if now - since >= rule.hold:
        # It lasted: believed from now on, and the level before it forgotten.
        return _believed(belief, seen, ()), Reading(seen, True, None, None)
    held = model.DropHeld(level=top, seen=seen, since=since)
    # Planned with the level before the fall, sampled now: fresh, so not "unknown" either.
    return replace(belief, held=held), Reading(model.Sample(top.value, seen.at), True, None, held)


def _believed(belief: Belief, seen: model.Sample, recent: tuple[model.Sample, ...]) -> Belief:
    kept = tuple(s for s in recent if s.at >= seen.at - SPAN)
    return replace(belief, level=seen, recent=(*kept, seen), held=None)


def _level(belief: Belief, seen: model.Sample) -> model.Sample:
    """The highest sample believed over the minute before ``seen``; after a gap longer than
    that, the last believed one (so a low first sample after an outage is not believed at once)."""
    assert belief.level is not None
    window = [s for s in belief.recent if s.at >= seen.at - SPAN]
    return max(window, key=lambda s: s.value, default=belief.level)


def _implausible(level: model.Sample, seen: model.Sample, rule: DropRule) -> bool:
    if level.value - seen.value < max(rule.rps_per_node, 1e-12):
        return False  # not even one node's worth: nothing would be lent on it anyway
    floor: float = level.value * rule.floor
    return seen.value < floor
