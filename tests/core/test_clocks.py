"""Clocks measured, not trusted: the skew estimator, and the planner's rules on it.

The estimator takes readings as a network answer gives them (sent, received, the server's
time, its resolution) and answers the median; the planner ages samples on Prometheus' clock,
lends nothing while a clock is past the bound (reclaims go on), and does not trust a ``since``
ahead of the API server's clock.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from rebalancer.core import clocks, model
from rebalancer.core.clocks import Against
from rebalancer.core.model import Action, Reason
from tests.support.factories import (
    POOL,
    T0,
    demand,
    lend,
    lent_nodes,
    planned,
    policy,
    pool_snapshot,
    proposal,
    refusals,
    returned,
    serving,
    serving_nodes,
    stepped,
)

S = timedelta(seconds=1)


def reading(
    offset: float, rtt: float = 0.0, at: datetime = T0, resolution: float = 0.0
) -> clocks.Reading:
    """A reading of a server ``offset`` seconds ahead, answered after ``rtt`` seconds, its
    clock stated in steps of ``resolution`` (cut down, as a ``Date`` header is)."""
    sent = at
    received = at + timedelta(seconds=rtt)
    true = sent + (received - sent) / 2 + timedelta(seconds=offset)
    server = true
    if resolution:
        server = datetime.fromtimestamp(
            true.timestamp() - true.timestamp() % resolution, tz=true.tzinfo
        )
    return clocks.Reading(sent, received, server, timedelta(seconds=resolution))


def estimated(*readings: clocks.Reading, now: datetime = T0) -> clocks.Skew:
    estimator = clocks.Estimator(Against.APISERVER)
    for r in readings:
        estimator = clocks.add(estimator, r)
    skew = clocks.estimate(estimator, now)
    assert skew is not None
    return skew


def skew(against: Against, seconds: float, uncertainty: float = 0.5) -> clocks.Skew:
    return clocks.Skew(against, seconds * S, uncertainty * S, 5, T0)


# -- the estimator ----------------------------------------------------------------------------


def test_a_reading_is_the_middle_of_the_round_trip_with_half_of_it_as_uncertainty() -> None:
    r = reading(90.0, rtt=0.4)
    assert abs(r.offset.total_seconds() - 90.0) < 1e-6
    assert r.uncertainty == timedelta(seconds=0.2)


def test_a_reading_keeps_its_offset_and_uncertainty_in_seconds_even_when_replaced() -> None:
    r = reading(-600.3, rtt=0.4, resolution=1.0)
    moved = dataclasses.replace(r, server=r.server + 2 * S)
    for each in (r, moved):
        assert each.offset_s == each.offset.total_seconds()
        assert each.uncertainty_s == each.uncertainty.total_seconds()
    assert moved.offset_s == r.offset_s + 2
    other = dataclasses.replace(r)
    object.__setattr__(other, "offset_s", 0.0)
    assert other == r  # the seconds are not a part of what it is


def test_a_date_header_cut_to_the_second_is_read_as_the_middle_of_its_second() -> None:
    r = reading(-600.3, rtt=0.0, resolution=1.0)
    assert abs(r.offset.total_seconds() - -600.3) <= 0.5
    assert r.uncertainty == timedelta(seconds=0.5)


def test_the_estimate_is_the_median_so_one_slow_answer_does_not_move_it() -> None:
    readings = [reading(90.0, 0.01, T0 + i * S) for i in range(6)]
    readings.append(reading(140.0, 100.0, T0 + 7 * S))  # a server that paused
    found = estimated(*readings, now=T0 + 200 * S)
    assert abs(found.offset.total_seconds() - 90.0) < 1e-6
    assert found.uncertainty < timedelta(seconds=0.1)
    assert found.readings == 7


def test_readings_older_than_the_max_age_say_nothing_and_only_the_recent_ones_count() -> None:
    estimator = clocks.Estimator(Against.PROMETHEUS)
    for i in range(40):
        estimator = clocks.add(estimator, reading(float(i), at=T0 + i * S))
    assert len(estimator.readings) == clocks.RECENT
    assert clocks.estimate(estimator, T0 + 40 * S + clocks.MAX_AGE + S) is None
    found = clocks.estimate(estimator, T0 + 40 * S)
    assert found is not None
    assert found.offset == timedelta(seconds=32)


def test_an_answer_received_before_it_was_sent_is_no_reading() -> None:
    backwards = clocks.Reading(T0, T0 - S, T0)
    assert clocks.add(clocks.Estimator(Against.APISERVER), backwards).readings == ()


def test_a_skew_within_its_uncertainty_corrects_nothing_and_one_beyond_it_corrects_all() -> None:
    assert clocks.corrected(T0, skew(Against.APISERVER, 0.4)) == T0
    assert clocks.corrected(T0, skew(Against.APISERVER, -600)) == T0 - 600 * S
    assert clocks.corrected(T0, None) == T0


def test_a_clock_is_past_the_bound_only_when_the_least_it_can_be_is() -> None:
    bound = timedelta(seconds=30)
    assert not skew(Against.APISERVER, 30.4, uncertainty=0.5).beyond(bound)
    assert skew(Against.APISERVER, -31, uncertainty=0.5).beyond(bound)


# -- the planner --------------------------------------------------------------------------------


def pool_plan(
    nodes: list[model.NodeView],
    measured: clocks.Clocks,
    sample: model.Sample | None,
    target: int = 0,
    now: datetime = T0,
    **policy_changes: object,
) -> model.PoolPlan:
    snap = dataclasses.replace(pool_snapshot(nodes, sample), clocks=measured)
    snapshot = model.Snapshot(now=now, pools={POOL: snap})
    result = planned(snapshot, {POOL: proposal(target)}, {POOL: policy(**policy_changes)})
    return result.pools[POOL]


def test_a_controller_behind_prometheus_ages_samples_on_prometheus_clock() -> None:
    # Prometheus is 90 s ahead; its newest sample is 130 s old by its own clock, 40 s by ours.
    # (A bound above the skew, so that the age rule is the one that shows.)
    behind = clocks.Clocks(skews=(skew(Against.PROMETHEUS, 90),), bound=timedelta(minutes=2))
    sample = demand(0.0, age=timedelta(seconds=40))
    result = pool_plan(serving_nodes(4), behind, sample, target=2)
    assert stepped(result, Action.LEND) == []
    assert refusals(result) == {Reason.METRICS_STALE: 2}
    assert "130s since the last good demand sample" in result.rejections[0].message
    assert "aged on Prometheus' clock, +90.0s" in result.rejections[0].message


def test_a_controller_ahead_of_prometheus_does_not_read_fresh_samples_as_lost() -> None:
    # Ten minutes ahead: by our clock the sample is 610 s old, by Prometheus' it is 10 s.
    ahead = clocks.Clocks(
        skews=(skew(Against.APISERVER, -600), skew(Against.PROMETHEUS, -600)),
        correction=-600 * S,
    )
    nodes = [*serving_nodes(4), *lent_nodes(2)]
    # The tick's now is the API server's (the correction), so the sample is 10 s old on it.
    result = pool_plan(nodes, ahead, demand(0.0, age=timedelta(seconds=10)), target=2)
    assert Reason.METRICS_LOST not in {s.reason for s in result.steps}
    assert stepped(result, Action.RECLAIM) == []


def test_past_the_bound_nothing_is_lent_and_the_refusal_names_the_clock() -> None:
    ahead = clocks.Clocks(skews=(skew(Against.APISERVER, -600),), correction=-600 * S)
    result = pool_plan(serving_nodes(4), ahead, demand(0.0), target=2)
    assert stepped(result, Action.LEND) == []
    assert refusals(result) == {Reason.CLOCK_SKEW: 2}
    message = result.rejections[0].message
    assert "the API server's clock is 600.0s" in message
    assert "behind this controller's" in message
    assert "bound of 30s" in message


def test_past_the_bound_safety_reclaims_still_happen() -> None:
    behind = clocks.Clocks(skews=(skew(Against.PROMETHEUS, 90),))
    # Demand for 5 nodes, 1 serves: the lent ones come back, clocks or not.
    nodes = [serving("s-00"), *lent_nodes(4)]
    result = pool_plan(nodes, behind, demand(50.0, age=timedelta(seconds=-80)), target=4)
    assert len(stepped(result, Action.RECLAIM)) == 4
    assert {s.reason for s in result.steps} == {Reason.DEMAND_ABOVE_SERVING}


def test_a_clock_that_cannot_be_measured_stops_lending_as_one_past_the_bound() -> None:
    blind = clocks.Clocks(unmeasured=frozenset({Against.PROMETHEUS}))
    result = pool_plan(serving_nodes(4), blind, demand(0.0), target=2)
    assert refusals(result) == {Reason.CLOCK_SKEW: 2}
    assert "Prometheus' clock cannot be measured" in result.rejections[0].message


def test_metrics_lost_past_the_grace_says_the_clock_it_was_told_on() -> None:
    blind = clocks.Clocks(unmeasured=frozenset({Against.PROMETHEUS}))
    nodes = [*serving_nodes(2), *lent_nodes(2)]
    result = pool_plan(nodes, blind, demand(0.0, age=timedelta(minutes=30)))
    assert {s.reason for s in result.steps} == {Reason.METRICS_LOST}
    assert "aged on the API server's clock: Prometheus' could not be read" in (
        result.steps[0].message
    )


def test_a_since_ahead_of_the_api_server_is_reported_and_holds_no_reclaim() -> None:
    measured = clocks.Clocks(skews=(skew(Against.APISERVER, 0.2),))
    # Lent "ten minutes from now" by a clock that was ahead; the strategy wants it back.
    future = lend(serving("l-00"), T0 + timedelta(minutes=10))
    result = pool_plan(
        [*serving_nodes(2), future], measured, demand(0.0), min_loan=timedelta(hours=1)
    )
    assert stepped(result, Action.RECLAIM) == ["l-00"]
    (finding,) = result.findings
    assert finding.reason is Reason.SINCE_IN_FUTURE
    assert finding.node == "l-00"
    assert "600s ahead of the API server's clock" in finding.message


def test_a_since_ahead_of_the_api_server_counts_as_now_for_the_cooldown() -> None:
    measured = clocks.Clocks(skews=(skew(Against.APISERVER, 0.2),))
    back = returned("s-09", T0 - timedelta(hours=2), T0 + timedelta(minutes=10))
    result = pool_plan(
        [*serving_nodes(2), back], measured, demand(0.0), target=3, cooldown=timedelta(minutes=1)
    )
    assert "s-09" not in stepped(result, Action.LEND)
    assert [f.reason for f in result.findings] == [Reason.SINCE_IN_FUTURE]


def test_a_since_within_the_measurement_and_the_second_it_is_cut_to_is_trusted() -> None:
    measured = clocks.Clocks(skews=(skew(Against.APISERVER, 0.0, uncertainty=0.5),))
    just = lend(serving("l-00"), T0 + timedelta(seconds=1.4))
    result = pool_plan([serving("s-00"), just], measured, demand(0.0))
    assert result.findings == ()


def test_the_future_bound_is_where_in_future_begins_to_find_a_time_ahead() -> None:
    """The planner scans every node's since against ``future_bound`` and asks ``in_future``
    only past it: the two must agree to the microsecond, with a skew and without one."""
    for measured in (
        clocks.NONE,
        clocks.Clocks(skews=(skew(Against.APISERVER, -3.7, uncertainty=0.3),)),
        clocks.Clocks(skews=(skew(Against.APISERVER, 42.25),), correction=2 * S),
    ):
        bound = clocks.future_bound(measured, T0)
        ahead = clocks.in_future(measured, T0)
        micro = timedelta(microseconds=1)
        assert [ahead(bound + d) is not None for d in (-micro, 0 * S, micro)] == [
            False,
            False,
            True,
        ]
