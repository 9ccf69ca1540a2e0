"""What the controller believes about a pool's demand, from one read to the next.

Where it sits: each tick the runtime (and the simulator, minute by minute) hands the sample the
metrics adapter read to ``judge`` together with the belief of the previous tick, keeps the new
belief, and puts the ``Reading`` into the pool's ``PoolSnapshot``. Pure: time, state and limits
are arguments; the caller holds the state.

Why it exists: the planner keeps no memory between ticks, but two safety rules need one
(DESIGN section 4, docs/design/safety-rules.md):

- **Unknown is one thing.** Prometheus unreachable, an empty result, a NaN or an infinity all
  mean "no sample this time". The belief keeps the last good sample, so demand is unknown
  *since that sample*, exactly as when Prometheus answers with an old sample: no new loans at
  once, reclaims after the grace. Before any sample at all, demand is unknown since the belief
  was made (the controller's start), so a restart while Prometheus is down reclaims after the
  grace, not on the first tick.
- **An implausible fall is not believed at once.** Serving traffic does not fall from its daily
  level to nothing in a minute; an exporter restart, a counter reset, a ``rate()`` over a young
  series or a load-balancer change does. A sample below
  ``level * drop_floor ** (minutes since the level was sampled)`` and at least one node's worth
  of requests below the level is *held*: the planner plans with the level before the fall and
  lends nothing. The hold ends when a sample is back within ``drop_floor`` of the level (the
  fall was a blip) or when the fall has lasted ``drop_hold`` (it is real: believed from then
  on). Rises are always believed at once: they can only make the controller reclaim sooner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from rebalancer.core import model

MINUTE = timedelta(minutes=1)
GAP_MINUTES = 2.0


@dataclass(frozen=True, slots=True)
class DropRule:
    """How fast demand may plausibly fall (defaults: docs/design/safety-rules.md)."""

    floor: float = 1 / 3  # the least share of its level demand keeps over one minute
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
    if level is None or seen.at < level.at:
        # First sample, or one older than what is believed (a restarted adapter): take it.
        fresh = replace(belief, level=seen if level is None else level, held=None)
        return fresh, Reading(fresh.level, True, None, None)
    if not _implausible(level, seen, rule, belief.held is not None):
        fresh = replace(belief, level=seen, held=None)
        return fresh, Reading(seen, True, None, None)
    since = belief.held.since if belief.held is not None else now
    if now - since >= rule.hold:
        fresh = replace(belief, level=seen, held=None)  # it lasted: believed from now on
        return fresh, Reading(seen, True, None, None)
    held = model.DropHeld(level=level, seen=seen, since=since)
    # Planned with the level before the fall, sampled now: fresh, so not "unknown" either.
    return replace(belief, held=held), Reading(model.Sample(level.value, seen.at), True, None, held)


def _implausible(level: model.Sample, seen: model.Sample, rule: DropRule, holding: bool) -> bool:
    if level.value - seen.value < max(rule.rps_per_node, 1e-12):
        return False  # not even one node's worth: nothing would be lent on it anyway
    # While a fall is held the floor does not decay: a low level that merely lasts must wait
    # for the hold, not slip under a floor that shrinks with time.
    # A gap between samples hides how fast the fall was: it is judged as at most
    # ``GAP_MINUTES`` of falling, so a low first sample after an outage is not believed at once.
    minutes = 1.0 if holding else min(GAP_MINUTES, max(0.0, (seen.at - level.at) / MINUTE))
    floor: float = level.value * rule.floor**minutes
    return seen.value < floor
