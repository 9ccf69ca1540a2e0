"""The demand belief: unknown since the last good sample, and implausible falls held."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest

from rebalancer.core import demand, model
from rebalancer.core.model import PoolName, Reason
from tests.support.factories import (
    T0,
    lent_nodes,
    planned,
    policy,
    proposal,
    refusals,
    serving_nodes,
)

MINUTE = timedelta(minutes=1)
RULE = demand.DropRule(floor=1 / 3, hold=10 * MINUTE, rps_per_node=10.0)


def sample(value: float, at: datetime) -> model.Sample:
    return model.Sample(value, at)


def feed(values: Sequence[float | None], rule: demand.DropRule = RULE) -> list[demand.Reading]:
    """One reading a minute, each sample taken 30 s before its tick."""
    belief = demand.start(T0)
    readings = []
    for i, value in enumerate(values):
        now = T0 + MINUTE * (i + 1)
        seen = None if value is None else sample(value, now - timedelta(seconds=30))
        belief, reading = demand.judge(belief, seen, now, rule)
        readings.append(reading)
    return readings


def test_a_gentle_fall_is_believed_at_once() -> None:
    readings = feed([300.0, 200.0, 120.0, 60.0])

    assert [r.demand.value for r in readings if r.demand] == [300.0, 200.0, 120.0, 60.0]
    assert all(r.held is None and r.known for r in readings)


def test_a_fall_to_nothing_in_a_minute_is_held_at_the_level_before_it() -> None:
    readings = feed([300.0, 0.0, 0.0])

    held = readings[1]
    assert held.held is not None
    assert held.demand is not None
    assert held.demand.value == 300.0
    assert held.held.seen.value == 0.0
    assert held.held.level.value == 300.0
    # Planned with the level, sampled now: not stale.
    assert held.demand.at == T0 + 2 * MINUTE - timedelta(seconds=30)


def test_a_held_fall_that_lasts_the_hold_is_believed() -> None:
    readings = feed([300.0] + [0.0] * 12)

    assert [r.held is not None for r in readings] == [False] + [True] * 10 + [False] * 2
    assert readings[11].demand is not None
    assert readings[11].demand.value == 0.0


def test_a_held_fall_that_recovers_is_released_at_once() -> None:
    readings = feed([300.0, 10.0, 10.0, 290.0])

    assert [r.held is not None for r in readings] == [False, True, True, False]
    assert readings[3].demand is not None
    assert readings[3].demand.value == 290.0


def test_a_low_level_that_only_lasts_does_not_slip_under_a_decaying_floor() -> None:
    # 300 -> 60 is a fall to 20 % in a minute; two minutes later 60 is still not back within a
    # third of 300, and the floor must not have decayed under it meanwhile.
    readings = feed([300.0, 60.0, 60.0, 60.0])

    assert all(r.held is not None for r in readings[1:])


def test_a_collapse_in_many_small_steps_is_held_like_one_in_a_single_step() -> None:
    # One sample a second, each under one node's worth (10 rps) below the one before it.
    belief = demand.start(T0)
    held = []
    for i, value in enumerate([25.0, 18.75, 12.5, 6.25, 0.0]):
        now = T0 + timedelta(seconds=i)
        belief, reading = demand.judge(belief, sample(value, now), now, RULE)
        held.append(reading.held is not None)

    assert held == [False, False, False, True, True]
    assert reading.demand is not None
    assert reading.demand.value == 25.0


def test_a_fall_smaller_than_one_node_is_never_held() -> None:
    readings = feed([9.0, 0.0])

    assert readings[1].held is None
    assert readings[1].demand is not None
    assert readings[1].demand.value == 0.0


def test_a_rise_is_always_believed_at_once() -> None:
    readings = feed([1.0, 900.0])

    assert readings[1].demand is not None
    assert readings[1].demand.value == 900.0


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -1.0])
def test_no_usable_sample_keeps_the_last_good_one_and_says_demand_is_unknown(
    bad: float | None,
) -> None:
    readings = feed([300.0, bad])

    assert readings[1].known is False
    assert readings[1].demand == readings[0].demand  # the last good one, with its own time
    assert readings[1].unknown_since is None


def test_before_any_sample_demand_is_unknown_since_the_start() -> None:
    readings = feed([None, None])

    assert readings[1].demand is None
    assert readings[1].unknown_since == T0


def test_a_first_sample_after_an_outage_that_is_far_below_the_level_is_held() -> None:
    belief = demand.start(T0)
    belief, _ = demand.judge(belief, sample(300.0, T0), T0, RULE)
    later = T0 + 30 * MINUTE

    _, reading = demand.judge(belief, sample(20.0, later), later, RULE)

    assert reading.held is not None


# ---------------------------------------------------------------------------------------------
# What the planner makes of a reading


def plan_reading(
    reading: demand.Reading, now: datetime, nodes: list[model.NodeView]
) -> model.PoolPlan:
    pool = model.PoolSnapshot(
        nodes=tuple(nodes),
        demand=reading.demand,
        demand_known=reading.known,
        unknown_since=reading.unknown_since,
        held=reading.held,
    )
    snapshot = model.Snapshot(now=now, pools={POOL: pool})
    limits = policy(staleness=2 * MINUTE, stale_grace=5 * MINUTE)
    return planned(snapshot, {POOL: proposal(2)}, {POOL: limits}).pools[POOL]


POOL = PoolName("gpu")


def test_unknown_demand_lends_nothing_at_once_and_reclaims_only_after_the_grace() -> None:
    nodes = [*serving_nodes(3), *lent_nodes(1)]
    last_good = sample(5.0, T0 - timedelta(seconds=10))
    unknown = demand.Reading(last_good, known=False, unknown_since=None, held=None)

    at_once = plan_reading(unknown, T0, nodes)
    within = plan_reading(unknown, T0 + 6 * MINUTE, nodes)
    past = plan_reading(unknown, T0 + 7 * MINUTE + timedelta(seconds=1), nodes)

    assert at_once.steps == ()
    assert refusals(at_once) == {Reason.METRICS_STALE: 1}
    assert within.steps == ()
    assert [s.reason for s in past.steps] == [Reason.METRICS_LOST]


def test_a_controller_that_starts_without_metrics_waits_the_grace_before_reclaiming() -> None:
    nodes = [*serving_nodes(3), *lent_nodes(1)]
    unknown = demand.Reading(None, known=False, unknown_since=T0, held=None)

    assert plan_reading(unknown, T0, nodes).steps == ()
    past = plan_reading(unknown, T0 + 8 * MINUTE, nodes)
    assert [s.reason for s in past.steps] == [Reason.METRICS_LOST]


def test_a_held_fall_lends_nothing_and_plans_with_the_level_before_it() -> None:
    readings = feed([25.0, 0.0])
    nodes = [*serving_nodes(3), *lent_nodes(1)]

    result = plan_reading(readings[1], T0 + 2 * MINUTE, nodes)

    # 25 rps need 3 serving nodes at 10 rps each: nothing more may be lent on the fall.
    assert result.steps == ()
    assert refusals(result) == {Reason.DEMAND_DROP_HELD: 1}
