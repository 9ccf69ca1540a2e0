"""The planner's safety rules, one example (or a few) per rule.

Every plan built here is also checked for the accounting rule of ``planning``: for each intent,
the nodes in its steps plus the counts in its rejections equal its count.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

import pytest

from rebalancer.core import model, nodestate, planning, windows
from rebalancer.core.model import Action, Origin, PodRole, PoolName, Reason
from rebalancer.core.policy import PoolPolicy
from tests.support.factories import (
    KEYS,
    POOL,
    T0,
    begin_reclaim,
    borrowed_pod,
    borrowed_pods,
    daemon_pod,
    demand,
    finish,
    inference_pod,
    lend,
    lending,
    lent_nodes,
    other_pod,
    plan,
    planned,
    policy,
    pool_snapshot,
    proposal,
    rebuilt,
    refusals,
    returned,
    serving,
    serving_nodes,
    stepped,
    unaccounted,
    with_overrides,
)

LEND, RECLAIM = Action.LEND, Action.RECLAIM
HOUR, MINUTE = timedelta(hours=1), timedelta(minutes=1)
NIGHTS = "Mon-Fri 22:00-06:00 UTC"  # closed at T0, a Monday at noon UTC


def window(text: str, zone: str = "UTC") -> windows.Window:
    parsed = windows.parse(text, zone)
    assert isinstance(parsed, windows.Window), parsed
    return parsed


def checked(result: model.PoolPlan) -> model.PoolPlan:
    assert unaccounted(result) == []
    return result


def corrupted_original(name: str) -> model.NodeView:
    """A lent node whose record of the originals is no longer JSON."""
    node = lend(serving(name), T0 - HOUR)
    return rebuilt(node, annotations={**node.annotations, KEYS.original: "{not json"})


# ---------------------------------------------------------------------------------------------
# Capacity: minimum serving, headroom, maximum fraction


def test_lending_stops_at_the_minimum_number_of_serving_nodes() -> None:
    result = checked(plan(serving_nodes(5), target=5, pool_policy=policy(min_serving=3)))

    assert len(stepped(result, LEND)) == 2
    assert refusals(result) == {Reason.MIN_SERVING: 3}


def test_a_pool_already_below_the_minimum_lends_nothing() -> None:
    result = checked(plan(serving_nodes(2), target=1, pool_policy=policy(min_serving=3)))

    assert result.steps == ()
    assert refusals(result) == {Reason.MIN_SERVING: 1}


def test_a_reclaiming_node_is_no_capacity_to_lend_from() -> None:
    back = begin_reclaim(lend(serving("r-00"), T0 - HOUR), T0 - MINUTE)
    nodes = [*serving_nodes(2), back]

    result = checked(plan(nodes, target=3, pool_policy=policy(min_serving=2)))

    assert stepped(result, LEND) == []
    assert refusals(result) == {Reason.WARMING: 3}


def test_a_node_back_from_a_loan_is_no_capacity_until_its_warm_up_has_passed() -> None:
    back = returned("back", lent_at=T0 - HOUR, back_at=T0 - 4 * MINUTE)
    nodes = [*serving_nodes(2), back]
    warming = policy(min_serving=2, warmup=5 * MINUTE)

    assert stepped(checked(plan(nodes, target=1, pool_policy=warming)), LEND) == []
    later = checked(plan(nodes, target=1, pool_policy=warming, now=T0 + 2 * MINUTE))
    assert len(stepped(later, LEND)) == 1


def test_a_node_whose_inference_pods_are_ready_is_warm_before_its_warm_up_ends() -> None:
    back = returned("back", lent_at=T0 - HOUR, back_at=T0 - MINUTE)
    starting = rebuilt(back, pods=(model.PodView("ns", "llm", PodRole.INFERENCE, ready=False),))
    ready = rebuilt(back, pods=(model.PodView("ns", "llm", PodRole.INFERENCE, ready=True),))
    warming = policy(min_serving=2, warmup=HOUR)

    # Two serving nodes and the returned one: only a warm third one leaves a node to lend.
    cold = checked(plan([*serving_nodes(2), starting], target=1, pool_policy=warming))
    warm = checked(plan([*serving_nodes(2), ready], target=1, pool_policy=warming))

    assert stepped(cold, LEND) == []
    assert refusals(cold) == {Reason.WARMING: 1}
    assert len(stepped(warm, LEND)) == 1


def test_a_serving_node_whose_inference_pod_is_not_ready_carries_no_load() -> None:
    starting = serving("busy", pods=[model.PodView("ns", "llm", PodRole.INFERENCE, ready=False)])
    nodes = [starting, *lent_nodes(1)]

    # It counts as on its way (it will serve), not as serving: 5 rps need one node, covered by
    # it; 15 rps need two, and only a lent node can be the second.
    calm = checked(plan(nodes, rps=5.0, target=1, pool_policy=policy(min_serving=1)))
    short = checked(plan(nodes, rps=15.0, target=1, pool_policy=policy(min_serving=1)))

    assert calm.steps == ()
    assert stepped(short, RECLAIM) == ["l-00"]


def test_lending_keeps_enough_nodes_for_demand_plus_headroom() -> None:
    # 50 rps * 1.2 / 10 rps per node = 6 nodes must serve, so 4 of 10 may be lent.
    result = checked(plan(serving_nodes(10), target=8, rps=50.0, pool_policy=policy(headroom=0.2)))

    assert len(stepped(result, LEND)) == 4
    assert refusals(result) == {Reason.HEADROOM: 4}


def test_nodes_already_lent_use_up_the_headroom_room() -> None:
    nodes = [*serving_nodes(7), *lent_nodes(3)]

    result = checked(plan(nodes, target=8, rps=50.0, pool_policy=policy(headroom=0.2)))

    assert len(stepped(result, LEND)) == 1
    assert refusals(result) == {Reason.HEADROOM: 4}


def test_demand_above_what_serves_reclaims_at_once_whatever_the_churn_limits() -> None:
    young = lent_nodes(6, at=T0 - 10 * MINUTE)
    churn = policy(min_loan=HOUR, max_step_fraction=0.1)

    # 55 rps needs 6 serving nodes; 4 serve.
    result = checked(plan([*serving_nodes(4), *young], rps=55.0, pool_policy=churn))

    assert len(stepped(result, RECLAIM)) == 2
    assert {s.reason for s in result.steps} == {Reason.DEMAND_ABOVE_SERVING}
    assert all(s.urgent and s.intent.origin is Origin.SAFETY for s in result.steps)


def test_nodes_already_returning_are_not_reclaimed_twice_for_demand() -> None:
    back = begin_reclaim(lend(serving("r-00"), T0 - HOUR), T0 - MINUTE)
    nodes = [*serving_nodes(4), back, *lent_nodes(5)]

    # 55 rps needs 6: 4 serve and 1 is on its way back, so one more is reclaimed.
    result = checked(plan(nodes, rps=55.0))

    assert len(stepped(result, RECLAIM)) == 1


def test_at_most_the_maximum_fraction_of_the_pool_is_lent() -> None:
    nodes = [*serving_nodes(8), *lent_nodes(2)]

    result = checked(plan(nodes, target=10, pool_policy=policy(max_lent_fraction=0.3)))

    assert len(stepped(result, LEND)) == 1
    assert refusals(result) == {Reason.MAX_FRACTION: 7}


# ---------------------------------------------------------------------------------------------
# Churn: minimum loan time, cooldown, per-tick rate limit


def test_a_strategy_may_not_take_back_a_node_lent_less_than_min_loan_ago() -> None:
    young = lend(serving("young"), T0 - 10 * MINUTE)
    old = lend(serving("old"), T0 - 2 * HOUR)

    result = checked(
        plan([*serving_nodes(2), young, old], target=0, pool_policy=policy(min_loan=HOUR))
    )

    assert stepped(result, RECLAIM) == ["old"]
    assert refusals(result) == {Reason.MIN_LOAN_TIME: 1}


def test_safety_reclaims_ignore_min_loan() -> None:
    young = lend(serving("young"), T0 - MINUTE)

    # 15 rps needs 2 serving nodes; 1 serves.
    result = checked(plan([serving("s"), young], rps=15.0, pool_policy=policy(min_loan=HOUR)))

    assert stepped(result, RECLAIM) == ["young"]
    assert result.steps[0].reason is Reason.DEMAND_ABOVE_SERVING


def test_a_closed_window_takes_a_node_back_before_min_loan() -> None:
    young = lend(serving("young"), T0 - MINUTE)

    result = checked(
        plan([serving("s"), young], pool_policy=policy(min_loan=HOUR, window=window(NIGHTS)))
    )

    assert stepped(result, RECLAIM) == ["young"]


def test_a_node_is_not_lent_again_within_cooldown_of_coming_back() -> None:
    back = returned("back", lent_at=T0 - 2 * HOUR, back_at=T0 - 5 * MINUTE)
    nodes = [back]
    cooling = policy(cooldown=15 * MINUTE, min_serving=0)

    now_result = checked(plan(nodes, target=1, pool_policy=cooling))
    later_result = checked(plan(nodes, target=1, pool_policy=cooling, now=T0 + 11 * MINUTE))

    assert now_result.steps == ()
    assert refusals(now_result) == {Reason.COOLDOWN: 1}
    assert stepped(later_result, LEND) == ["back"]


def test_a_rolled_back_lend_also_starts_the_cooldown() -> None:
    rolled_back = finish(lending(serving("n"), T0 - 2 * MINUTE), T0 - MINUTE)
    limits = policy(cooldown=15 * MINUTE, min_serving=0, warmup=timedelta(0))

    result = checked(plan([rolled_back], target=1, pool_policy=limits))

    assert refusals(result) == {Reason.COOLDOWN: 1}


def test_strategy_lends_are_limited_per_tick() -> None:
    result = checked(plan(serving_nodes(8), target=6, pool_policy=policy(max_step_fraction=0.25)))

    assert len(stepped(result, LEND)) == 2
    assert refusals(result) == {Reason.RATE_LIMIT: 4}


def test_strategy_reclaims_are_limited_per_tick() -> None:
    nodes = [*serving_nodes(2), *lent_nodes(6)]

    result = checked(plan(nodes, target=0, pool_policy=policy(max_step_fraction=0.25)))

    assert len(stepped(result, RECLAIM)) == 2
    assert refusals(result) == {Reason.RATE_LIMIT: 4}


def test_the_rate_limit_allows_one_change_per_tick_in_a_small_pool() -> None:
    small = policy(max_step_fraction=0.1, min_serving=0)

    result = checked(plan(serving_nodes(2), target=2, pool_policy=small))

    assert len(stepped(result, LEND)) == 1
    assert refusals(result) == {Reason.RATE_LIMIT: 1}


def test_safety_reclaims_are_not_rate_limited() -> None:
    nodes = [*serving_nodes(2), *lent_nodes(6)]

    result = checked(plan(nodes, rps=None, pool_policy=policy(max_step_fraction=0.25)))

    assert len(stepped(result, RECLAIM)) == 6


def test_operator_lends_are_not_rate_limited() -> None:
    asked = [with_overrides(n, lend="now") for n in serving_nodes(3, prefix="op")]

    result = checked(plan([*serving_nodes(5), *asked], pool_policy=policy(max_step_fraction=0.25)))

    assert stepped(result, LEND) == ["op-00", "op-01", "op-02"]
    assert {s.reason for s in result.steps} == {Reason.OPERATOR_LEND_NOW}


# ---------------------------------------------------------------------------------------------
# Pauses


def test_a_global_freeze_moves_nothing_and_reports_every_refusal() -> None:
    asked = with_overrides(lent_nodes(1, prefix="x")[0], reclaim="now")
    nodes = [*serving_nodes(3), *lent_nodes(2), asked]

    result = checked(plan(nodes, target=5, rps=None, frozen=True))

    assert result.steps == ()
    # The operator's reclaim, the metrics-lost reclaim of the three lent nodes and the strategy's
    # lends (5 - 3 lent) are all refused, none silently.
    assert [(i.origin, i.count) for i in result.intents] == [
        (Origin.OPERATOR, 1),
        (Origin.SAFETY, 3),
        (Origin.STRATEGY, 2),
    ]
    assert refusals(result) == {Reason.FROZEN: 6}


def test_a_global_pause_stops_lending_and_strategy_moves_but_not_safety_reclaims() -> None:
    nodes = [*serving_nodes(2), *lent_nodes(3)]

    # 25 rps need 3 serving nodes at 10 rps each; 2 serve: one lent node comes back.
    short = checked(plan(nodes, target=0, rps=25.0, paused=True))
    calm = checked(plan(nodes, target=0, rps=5.0, paused=True))
    lending = checked(plan([*serving_nodes(4)], target=2, rps=5.0, paused=True))

    assert [(s.node, s.reason) for s in short.steps] == [("l-00", Reason.DEMAND_ABOVE_SERVING)]
    assert calm.steps == ()  # the strategy's reclaims wait for the pause to end
    assert refusals(calm) == {Reason.PAUSED: 3}
    assert lending.steps == ()
    assert refusals(lending) == {Reason.PAUSED: 2}


def test_a_global_pause_still_takes_back_a_node_an_operator_asked_for() -> None:
    asked = with_overrides(lent_nodes(1, prefix="x")[0], reclaim="now")

    result = checked(plan([*serving_nodes(2), asked], paused=True))

    assert [(s.node, s.reason) for s in result.steps] == [("x-00", Reason.OPERATOR_RECLAIM_NOW)]


def test_a_global_pause_refuses_an_operator_lend_now() -> None:
    node = with_overrides(serving("n"), lend="now")

    result = checked(plan([serving("s"), node], paused=True))

    assert result.steps == ()
    assert [(r.reason, r.node) for r in result.rejections] == [(Reason.PAUSED, "n")]


def test_a_pool_pause_freezes_only_that_pool() -> None:
    other = PoolName("other")
    snapshot = model.Snapshot(
        now=T0,
        pools={
            POOL: pool_snapshot(serving_nodes(3), demand(0.0)),
            other: pool_snapshot(serving_nodes(3, prefix="o"), demand(0.0)),
        },
    )
    proposals = {POOL: proposal(2), other: proposal(2)}

    result = planned(snapshot, proposals, {POOL: policy(), other: policy()}, paused_pools=[POOL])

    assert result.pools[POOL].steps == ()
    assert refusals(result.pools[POOL]) == {Reason.PAUSED: 2}
    assert len(stepped(result.pools[other], LEND)) == 2


def test_a_paused_pool_without_a_proposal_still_takes_its_nodes_back_when_metrics_are_lost() -> (
    None
):
    result = checked(plan(lent_nodes(2), rps=None, paused_pools=[POOL]))

    assert [(s.node, s.reason) for s in result.steps] == [
        ("l-00", Reason.METRICS_LOST),
        ("l-01", Reason.METRICS_LOST),
    ]


def test_a_paused_node_is_not_lent() -> None:
    node = with_overrides(serving("p"), paused="true")

    result = checked(plan([node], target=1, pool_policy=policy(min_serving=0)))

    assert result.steps == ()
    assert refusals(result) == {Reason.NODE_PAUSED: 1}


def test_a_paused_node_is_not_reclaimed_by_the_strategy() -> None:
    node = with_overrides(lend(serving("p"), T0 - HOUR), paused="true")

    result = checked(plan([serving("s"), node], target=0))

    assert result.steps == ()
    assert refusals(result) == {Reason.NODE_PAUSED: 1}


def test_a_node_pause_that_expired_no_longer_holds() -> None:
    node = with_overrides(
        lend(serving("p"), T0 - HOUR), paused="true", override_until="2026-03-02T11:00:00Z"
    )

    result = checked(plan([serving("s"), node], target=0))

    assert stepped(result, RECLAIM) == ["p"]


@pytest.mark.parametrize(
    ("case", "rps", "overrides", "pool_window"),
    [
        ("metrics lost", None, {}, "always"),
        ("demand above serving", 100.0, {}, "always"),
        ("pool window closed", 0.0, {}, NIGHTS),
        ("node window closed", 0.0, {"window": "never"}, "always"),
        ("reclaim=now", 0.0, {"reclaim": "now"}, "always"),
        ("lend=never", 0.0, {"lend": "never"}, "always"),
    ],
)
def test_a_paused_node_is_never_touched_even_by_safety_reclaims(
    case: str, rps: float | None, overrides: dict[str, str], pool_window: str
) -> None:
    node = with_overrides(lend(serving("p"), T0 - HOUR), paused="true", **overrides)

    result = checked(
        plan([serving("s"), node], rps=rps, pool_policy=policy(window=window(pool_window)))
    )

    assert result.steps == (), case
    assert refusals(result) == {Reason.NODE_PAUSED: 1}, case
    assert all(r.node in (None, "p") for r in result.rejections)


# ---------------------------------------------------------------------------------------------
# Metrics


def test_a_stale_demand_sample_blocks_lending_but_reclaims_nothing_yet() -> None:
    nodes = [*serving_nodes(3), *lent_nodes(1)]

    result = checked(plan(nodes, target=4, age=3 * MINUTE))

    assert result.steps == ()
    assert refusals(result) == {Reason.METRICS_STALE: 3}


def test_a_demand_sample_exactly_as_old_as_the_limit_is_still_fresh() -> None:
    result = checked(plan(serving_nodes(3), target=1, age=2 * MINUTE))

    assert len(stepped(result, LEND)) == 1


def test_a_stale_demand_sample_blocks_operator_lends_too() -> None:
    node = with_overrides(serving("n"), lend="now")

    result = checked(plan([*serving_nodes(3), node], age=3 * MINUTE))

    assert result.steps == ()
    assert refusals(result) == {Reason.METRICS_STALE: 1}


def test_a_missing_demand_sample_reclaims_every_lent_node_and_lends_nothing() -> None:
    in_flight = lending(serving("in-flight"), T0 - MINUTE)
    nodes = [*serving_nodes(3), *lent_nodes(3, at=T0 - MINUTE), in_flight]

    result = checked(plan(nodes, target=6, rps=None, pool_policy=policy(min_loan=HOUR)))

    assert stepped(result, RECLAIM) == ["l-00", "l-01", "l-02"]
    assert stepped(result, LEND) == []
    assert all(s.urgent and s.reason is Reason.METRICS_LOST for s in result.steps)
    assert refusals(result)[Reason.METRICS_MISSING] > 0


def test_a_sample_within_the_grace_period_keeps_lent_nodes_lent() -> None:
    # staleness 2 min + grace 5 min: a sample 7 minutes old is stale, not lost.
    result = checked(plan([*serving_nodes(3), *lent_nodes(3)], age=7 * MINUTE))

    assert result.steps == ()


def test_a_sample_older_than_the_grace_period_reclaims_every_lent_node() -> None:
    result = checked(
        plan([*serving_nodes(3), *lent_nodes(3)], age=7 * MINUTE + timedelta(seconds=1))
    )

    assert len(stepped(result, RECLAIM)) == 3
    assert {s.reason for s in result.steps} == {Reason.METRICS_LOST}


def test_an_unguarded_policy_ignores_missing_metrics() -> None:
    result = checked(
        plan(
            [*serving_nodes(3), *lent_nodes(1)],
            target=3,
            rps=None,
            pool_policy=policy(guards=frozenset()),
        )
    )

    assert len(stepped(result, LEND)) == 2


def test_an_unguarded_policy_does_not_reclaim_for_demand_above_serving() -> None:
    # The simulator's baselines run without these guards, so that their own rule shows.
    nodes = [*serving_nodes(4), *lent_nodes(6)]

    result = checked(plan(nodes, rps=55.0, pool_policy=policy(guards=frozenset())))

    assert result.steps == ()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0])
def test_a_demand_sample_that_is_not_a_rate_counts_as_missing(value: float) -> None:
    nodes = [*serving_nodes(3), *lent_nodes(2)]

    result = checked(plan(nodes, target=4, rps=value))

    assert stepped(result, RECLAIM) == ["l-00", "l-01"]
    assert {s.reason for s in result.steps} == {Reason.METRICS_LOST}
    assert refusals(result) == {Reason.METRICS_MISSING: 4}
    assert "not a rate" in result.rejections[0].message


WEEK = timedelta(days=7)


@pytest.mark.parametrize(
    ("budget", "lends"),
    [
        # A loan may cost 8 minutes (policy()): the minute a jump is seen, then a 2 + 5 minute
        # return of the nodes taken back for it.
        pytest.param(model.ErrorBudget(10, WEEK, 2), 2, id="room for one more loan's worst"),
        pytest.param(model.ErrorBudget(10, WEEK, 3), 0, id="not room enough"),
        pytest.param(model.ErrorBudget(10, WEEK, 12), 0, id="overspent"),
        pytest.param(model.ErrorBudget(8, WEEK, 0), 2, id="unspent, as large as a loan's worst"),
        pytest.param(model.ErrorBudget(7, WEEK, 0), 0, id="smaller than a loan's worst"),
        pytest.param(model.ErrorBudget(0, WEEK, 0), 0, id="zero"),
        pytest.param(None, 2, id="no slo"),
    ],
)
def test_no_loan_the_error_budget_could_not_pay_for(
    budget: model.ErrorBudget | None, lends: int
) -> None:
    assert policy().loan_risk_minutes == 8
    result = checked(plan(serving_nodes(3), target=2, budget=budget))

    assert len(stepped(result, LEND)) == lends
    if not lends:
        assert budget is not None
        assert refusals(result) == {Reason.BUDGET_SPENT: 2}
        assert result.rejections[0].message.startswith(
            f"the error budget cannot cover another loan ({budget.spent_minutes} of "
            f"{budget.allowed_minutes} minute(s) spent in the last 7 day(s), a loan may cost 8)"
            " and the pool's history covers none"
        )


def cover(peak: float, ratio: float, window: int = 30) -> model.Cover:
    """A cover judged on a day: the ``window``-minute peak was ``peak``, and no jump within a
    loan's risk went past ``ratio`` times it."""
    jump = model.Jump(timedelta(minutes=window), peak, ratio, ratio)
    return model.Cover(jumps=(jump,), judged=timedelta(days=1))


@pytest.mark.parametrize(
    ("peak", "ratio", "rps", "lends"),
    [
        # 10 rps per node: a 20 rps peak that jumped at most 1.5 times is covered by 3 nodes.
        pytest.param(20.0, 1.5, 5.0, 3, id="covered: 3 of 6 serve"),
        pytest.param(20.0, 2.0, 5.0, 2, id="a larger jump seen: 4 of 6 serve"),
        pytest.param(20.0, 1.5, 30.0, 1, id="a sample above the peak raises it: 5 serve"),
        pytest.param(20.0, math.inf, 5.0, 0, id="a jump out of zero covers nothing"),
    ],
)
def test_a_short_error_budget_lends_only_what_the_history_covers(
    peak: float, ratio: float, rps: float, lends: int
) -> None:
    spent = model.ErrorBudget(10, WEEK, 3)

    result = checked(
        plan(serving_nodes(6), target=5, rps=rps, budget=spent, cover=cover(peak, ratio))
    )

    assert len(stepped(result, LEND)) == lends
    assert refusals(result) == {Reason.BUDGET_SPENT: 5 - lends}
    assert "(3 of 10 minute(s) spent in the last 7 day(s)" in result.rejections[0].message


def test_an_unspent_error_budget_lends_past_the_cover() -> None:
    result = checked(
        plan(
            serving_nodes(6),
            target=5,
            rps=5.0,
            budget=model.ErrorBudget(10, WEEK, 2),
            cover=cover(20.0, 1.5),
        )
    )

    assert len(stepped(result, LEND)) == 5


def test_a_short_error_budget_takes_back_the_loans_its_history_does_not_cover() -> None:
    spent = model.ErrorBudget(10, WEEK, 3)

    result = checked(
        plan([*serving_nodes(2), *lent_nodes(4)], rps=5.0, budget=spent, cover=cover(20.0, 1.5))
    )

    assert {s.reason for s in result.steps} == {Reason.BUDGET_EXPOSED}
    assert len(stepped(result, RECLAIM)) == 1  # 3 nodes carry 30 rps: 2 serve, 1 comes back
    assert "3 serving nodes carry 30 rps, the 30-minute peak x 1.5" in result.steps[0].message


def test_a_short_error_budget_takes_every_loan_back_while_demand_is_above_what_serves() -> None:
    # An episode under way with the budget short: it must end within one return time, so every
    # loan comes back, not only what the demand seen needs.
    spent = model.ErrorBudget(10, WEEK, 3)

    result = checked(
        plan([*serving_nodes(2), *lent_nodes(4)], rps=25.0, budget=spent, cover=cover(20.0, 1.5))
    )

    assert {s.reason for s in result.steps} == {Reason.DEMAND_ABOVE_SERVING, Reason.BUDGET_EXPOSED}
    assert len(stepped(result, RECLAIM)) == 4


def test_a_spent_error_budget_refuses_an_operator_lend_now_and_keeps_safety_reclaims() -> None:
    asked = with_overrides(serving("asked"), lend="now")
    spent = model.ErrorBudget(10, WEEK, 10)

    lend_now = checked(plan([*serving_nodes(3), asked], budget=spent))
    short = checked(plan([*serving_nodes(1), *lent_nodes(3)], rps=25.0, budget=spent))

    assert refusals(lend_now) == {Reason.BUDGET_SPENT: 1}
    assert len(stepped(short, RECLAIM)) == 3
    assert {s.reason for s in short.steps} == {Reason.DEMAND_ABOVE_SERVING, Reason.BUDGET_EXPOSED}


def test_requests_queueing_beyond_the_limit_block_lending() -> None:
    result = checked(
        plan(serving_nodes(3), target=2, queue=50.0, pool_policy=policy(queue_limit=10.0))
    )

    assert result.steps == ()
    assert refusals(result) == {Reason.QUEUE_BUILDING: 2}


def test_a_queue_at_the_limit_does_not_block_lending() -> None:
    result = checked(
        plan(serving_nodes(3), target=2, queue=10.0, pool_policy=policy(queue_limit=10.0))
    )

    assert len(stepped(result, LEND)) == 2


def test_a_stale_queue_sample_is_ignored() -> None:
    result = checked(
        plan(serving_nodes(3), target=2, queue=50.0, queue_age=3 * MINUTE, pool_policy=policy())
    )

    assert len(stepped(result, LEND)) == 2


def test_a_queue_blocks_lending_and_takes_nothing_back_when_queue_reclaims_are_off() -> None:
    limits = policy(queue_reclaims=False)

    result = checked(
        plan([*serving_nodes(3), *lent_nodes(2)], target=2, queue=50.0, pool_policy=limits)
    )

    assert result.steps == ()


def test_requests_queueing_above_the_limit_take_back_enough_nodes_to_clear_them() -> None:
    # 1,300 requests wait; a node serves 10 rps, 600 a minute: 3 nodes clear them in a minute,
    # one is already on its way back, so two more come back.
    back = begin_reclaim(lend(serving("r"), T0 - HOUR), T0 - MINUTE)
    nodes = [*serving_nodes(3), *lent_nodes(3), back]

    result = checked(plan(nodes, target=3, queue=1300.0))

    assert [(s.node, s.reason, s.urgent) for s in result.steps] == [
        ("l-00", Reason.QUEUE_ABOVE_LIMIT, True),
        ("l-01", Reason.QUEUE_ABOVE_LIMIT, True),
    ]


# ---------------------------------------------------------------------------------------------
# Units: demand and a node's capacity in tokens or sequences, the arithmetic the same

TOKENS = model.Unit.TOKENS_PER_SECOND
SEQUENCES = model.Unit.CONCURRENT_SEQUENCES


def test_demand_in_tokens_is_compared_with_what_a_node_generates() -> None:
    # 5,000 tokens/s need 3 nodes of 2,400 (2.08, rounded up): of 6 serving, 3 may be lent.
    tokens = policy(rps_per_node=2400.0, unit=TOKENS, min_serving=0)

    result = checked(plan(serving_nodes(6), target=6, rps=5000.0, pool_policy=tokens))

    assert len(stepped(result, LEND)) == 3
    assert refusals(result) == {Reason.HEADROOM: 3}
    # The same demand in requests per second against 10 a node would lend nothing.
    same = checked(plan(serving_nodes(6), target=6, rps=5000.0, pool_policy=policy(min_serving=0)))
    assert stepped(same, LEND) == []


def test_a_refusal_about_demand_names_the_pools_unit() -> None:
    # The error budget is spent and demand is above what serves: every loan comes back, and
    # the words say tokens/s, not rps.
    tokens = policy(rps_per_node=2400.0, unit=TOKENS, min_serving=0)
    spent = model.ErrorBudget(allowed_minutes=10, window=timedelta(days=7), spent_minutes=10)
    nodes = [*serving_nodes(3), *lent_nodes(2)]

    result = checked(plan(nodes, rps=9000.0, pool_policy=tokens, budget=spent))

    exposed = [s for s in result.steps if s.reason is Reason.BUDGET_EXPOSED]
    assert exposed
    assert exposed[0].message.startswith(
        "demand 9000 tokens/s is above what 3 warm nodes carry and the error budget"
    )
    assert all("rps" not in s.message for s in result.steps)


def test_a_queue_in_a_tokens_pool_takes_back_a_wave_of_the_step_a_request_having_no_size() -> None:
    # 1,300 requests wait. In tokens a request has no size, so no number of nodes "clears"
    # them: the pool's per-tick step (a quarter of 8 nodes: 2) comes back, as for an alert. In
    # requests per second, 1,300 of them is one node of 2,400 rps for a minute.
    nodes = [*serving_nodes(3), *lent_nodes(5)]

    def queue_reclaims(unit: model.Unit) -> list[model.Step]:
        limits = policy(rps_per_node=2400.0, unit=unit, max_step_fraction=0.25)
        result = checked(plan(nodes, target=5, queue=1300.0, pool_policy=limits))
        return [s for s in result.steps if s.reason is Reason.QUEUE_ABOVE_LIMIT]

    tokens, requests = queue_reclaims(TOKENS), queue_reclaims(model.Unit.REQUESTS_PER_SECOND)

    assert (len(tokens), len(requests)) == (2, 1)
    assert tokens[0].message == (
        "1300 requests wait (limit 0): a request has no size in tokens/s, so 2 nodes come "
        "back, 0 are on their way back"
    )
    assert requests[0].message == (
        "1300 requests wait (limit 0): 1 nodes clear them within a minute, 0 are on their way back"
    )


def test_a_queue_in_sequences_takes_back_a_place_for_every_waiting_request() -> None:
    # 100 requests wait for a place; a node runs 48 sequences: 3 nodes hold them all at once.
    nodes = [*serving_nodes(3), *lent_nodes(5)]
    limits = policy(rps_per_node=48.0, unit=SEQUENCES)

    result = checked(plan(nodes, target=5, queue=100.0, pool_policy=limits))

    assert [s.reason for s in result.steps] == [Reason.QUEUE_ABOVE_LIMIT] * 3


# ---------------------------------------------------------------------------------------------
# Which nodes may be lent


@pytest.mark.parametrize("role", [PodRole.INFERENCE, PodRole.OTHER])
def test_a_node_with_an_inference_or_other_pod_is_not_lent(role: PodRole) -> None:
    busy = serving("busy", pods=[daemon_pod(), model.PodView("ns", "p", role)])

    result = checked(plan([busy], target=1, pool_policy=policy(min_serving=0)))

    assert result.steps == ()
    assert refusals(result) == {Reason.NOT_IDLE: 1}


@pytest.mark.parametrize("pods", [(daemon_pod(),), (borrowed_pod("job"),), ()])
def test_daemonset_and_borrowed_pods_do_not_make_a_node_busy(
    pods: tuple[model.PodView, ...],
) -> None:
    result = checked(plan([serving("n", pods=pods)], target=1, pool_policy=policy(min_serving=0)))

    assert stepped(result, LEND) == ["n"]


def test_only_the_idle_nodes_of_a_mixed_pool_are_lent() -> None:
    nodes = [serving("a", pods=[inference_pod()]), serving("b"), serving("c", pods=[other_pod()])]

    result = checked(plan(nodes, target=2, pool_policy=policy(min_serving=0)))

    assert stepped(result, LEND) == ["b"]
    assert refusals(result) == {Reason.NOT_IDLE: 1}


def test_a_node_that_is_not_ready_is_not_lent() -> None:
    result = checked(plan([serving("n", ready=False)], target=1, pool_policy=policy(min_serving=0)))

    assert result.steps == ()
    assert refusals(result) == {Reason.NOT_READY: 1}


def test_a_not_ready_serving_node_carries_no_load_for_the_headroom_rule() -> None:
    nodes = [serving("down", ready=False), *serving_nodes(3)]
    # 20 rps need 2 nodes of 10 rps: of the 3 ready nodes, only 1 may be lent.
    result = checked(plan(nodes, target=4, rps=20.0, pool_policy=policy(min_serving=0)))

    assert [s.node for s in result.steps] == ["s-00"]
    assert refusals(result) == {Reason.NOT_READY: 3}


def test_when_no_serving_node_is_left_the_refusal_says_so() -> None:
    back = begin_reclaim(lend(serving("r"), T0 - HOUR), T0 - MINUTE)

    result = checked(plan([back], target=1, pool_policy=policy(min_serving=0)))

    assert result.steps == ()
    assert refusals(result) == {Reason.WARMING: 1}
    assert "on their way back and not warm yet" in result.rejections[0].message


# ---------------------------------------------------------------------------------------------
# Windows


def test_a_closed_pool_window_reclaims_lent_nodes_and_lends_none() -> None:
    nodes = [*serving_nodes(3), *lent_nodes(2)]

    result = checked(plan(nodes, target=4, pool_policy=policy(window=window(NIGHTS))))

    assert stepped(result) == ["l-00", "l-01"]
    assert all(s.reason is Reason.WINDOW_CLOSED and s.urgent for s in result.steps)
    assert {s.intent.origin for s in result.steps} == {Origin.SCHEDULE}
    # The two taken back are no capacity yet: of the 3 warm ones, 2 could be lent but for
    # the window, and the minimum of one serving node refuses the rest.
    assert refusals(result) == {Reason.MIN_SERVING: 2, Reason.OUTSIDE_WINDOW: 2}


def test_an_open_pool_window_lends() -> None:
    night = T0 + 11 * HOUR  # Monday 23:00 UTC

    result = checked(
        plan(serving_nodes(3), target=2, now=night, pool_policy=policy(window=window(NIGHTS)))
    )

    assert len(stepped(result, LEND)) == 2


def test_a_node_window_override_replaces_the_pool_window() -> None:
    # 13:00 in Berlin at T0: the node's office-hours window is open, the pool's night one is not.
    opened = with_overrides(serving("opened"), window="Mon-Fri 09:00-17:00 Europe/Berlin")
    nodes = [*serving_nodes(2), opened]

    nights = policy(window=window(NIGHTS), min_serving=0)

    result = checked(plan(nodes, target=3, pool_policy=nights))

    assert stepped(result, LEND) == ["opened"]
    assert refusals(result) == {Reason.OUTSIDE_WINDOW: 2}


def test_a_node_window_override_can_close_a_node_the_pool_would_lend() -> None:
    closed = with_overrides(lend(serving("closed"), T0 - HOUR), window="never")

    result = checked(plan([serving("s"), closed, *lent_nodes(1)]))

    assert stepped(result, RECLAIM) == ["closed"]
    assert result.steps[0].reason is Reason.WINDOW_CLOSED


def test_a_node_window_without_a_zone_is_read_in_the_pool_zone() -> None:
    # 12:00 UTC is 21:00 in Tokyo.
    node = with_overrides(serving("n"), window="daily 20:00-23:00")
    tokyo = policy(window=windows.NEVER, zone="Asia/Tokyo", min_serving=0)

    result = checked(plan([node], target=1, pool_policy=tokyo))

    assert stepped(result, LEND) == ["n"]


# ---------------------------------------------------------------------------------------------
# Operator overrides


def test_lend_now_ignores_the_window() -> None:
    node = with_overrides(serving("n"), lend="now")

    result = checked(plan([serving("s"), node], pool_policy=policy(window=windows.NEVER)))

    assert stepped(result, LEND) == ["n"]
    assert result.steps[0].intent.origin is Origin.OPERATOR
    assert result.steps[0].reason is Reason.OPERATOR_LEND_NOW


def test_lend_now_does_not_ignore_the_headroom() -> None:
    node = with_overrides(serving("n"), lend="now")

    # 15 rps needs both nodes.
    result = checked(plan([serving("s"), node], rps=15.0))

    assert result.steps == ()
    assert refusals(result) == {Reason.HEADROOM: 1}
    assert result.rejections[0].node == "n"


def test_lend_now_ignores_the_cooldown() -> None:
    back = returned("back", lent_at=T0 - HOUR, back_at=T0 - MINUTE)
    node = with_overrides(back, lend="now")

    result = checked(plan([serving("s"), node], pool_policy=policy(cooldown=HOUR, warmup=0 * HOUR)))

    assert stepped(result, LEND) == ["back"]


def test_lend_now_of_a_node_still_warming_up_leaves_the_warm_capacity_as_it_was() -> None:
    back = with_overrides(returned("back", lent_at=T0 - HOUR, back_at=T0 - MINUTE), lend="now")
    nodes = [*serving_nodes(3), back]

    # 3 warm nodes, minimum 1: the strategy may lend 2 of them besides the operator's node.
    result = checked(plan(nodes, target=4, pool_policy=policy(min_serving=1)))

    assert stepped(result, LEND) == ["back", "s-00", "s-01"]


def test_lend_now_keeps_a_lent_node_lent_outside_its_window() -> None:
    node = with_overrides(lend(serving("n"), T0 - HOUR), lend="now")

    result = checked(plan([serving("s"), node], pool_policy=policy(window=windows.NEVER)))

    assert result.steps == ()


def test_a_strategy_does_not_take_back_a_node_an_operator_lent_with_lend_now() -> None:
    # Taken back, the node would be lent again as soon as it returned (lend=now skips the
    # cooldown), preempting its training every few minutes.
    pinned = with_overrides(lend(serving("pinned"), T0 - HOUR), lend="now")

    result = checked(plan([serving("s"), pinned, *lent_nodes(1)], target=0))

    assert stepped(result, RECLAIM) == ["l-00"]
    assert refusals(result) == {Reason.OPERATOR_LEND_NOW: 1}


def test_safety_reclaims_still_take_a_node_lent_with_lend_now() -> None:
    pinned = with_overrides(lend(serving("pinned"), T0 - HOUR), lend="now")

    result = checked(plan([serving("s"), pinned], rps=None))

    assert stepped(result, RECLAIM) == ["pinned"]


def test_lend_never_reclaims_a_lent_node() -> None:
    node = with_overrides(lend(serving("n"), T0 - MINUTE), lend="never")

    keep = policy(min_loan=HOUR, min_serving=2)

    result = checked(plan([serving("s"), node], target=1, pool_policy=keep))

    assert stepped(result) == ["n"]
    assert result.steps[0].action is RECLAIM
    assert result.steps[0].reason is Reason.OPERATOR_NEVER
    assert result.steps[0].urgent


def test_lend_never_keeps_a_serving_node_from_being_lent() -> None:
    node = with_overrides(serving("n"), lend="never")

    result = checked(plan([node], target=1, pool_policy=policy(min_serving=0)))

    assert result.steps == ()
    assert refusals(result) == {Reason.LEND_NEVER: 1}


def test_reclaim_now_takes_a_lent_node_back_at_once() -> None:
    node = with_overrides(lend(serving("n"), T0 - MINUTE), reclaim="now")
    churn = policy(min_loan=HOUR, max_step_fraction=0.01)

    result = checked(plan([serving("s"), node, *lent_nodes(1)], target=1, pool_policy=churn))

    assert stepped(result, RECLAIM) == ["n"]
    assert result.steps[0].reason is Reason.OPERATOR_RECLAIM_NOW
    assert result.steps[0].urgent


def test_reclaim_now_wins_over_lend_now() -> None:
    node = with_overrides(lend(serving("n"), T0 - HOUR), reclaim="now", lend="now")

    result = checked(plan([serving("s"), node]))

    assert stepped(result, RECLAIM) == ["n"]
    assert [f.key for f in result.findings] == [KEYS.lend]


@pytest.mark.parametrize(
    "annotations",
    [
        {"lend": "no"},
        {"lend": "nevr"},
        {"lend": "sometimes", "paused": "yes"},
        {"lend": "never", "override_until": "tomorrow"},
        {"reclaim": "later"},
        {"window": "Mon-Fri 25:00-06:00"},
    ],
)
def test_a_node_whose_overrides_cannot_be_read_is_kept_serving_and_reported(
    annotations: dict[str, str],
) -> None:
    node = with_overrides(serving("n"), **annotations)

    result = checked(plan([node, serving("s")], target=1, pool_policy=policy(min_serving=0)))

    assert stepped(result, LEND) == ["s"]
    assert {f.reason for f in result.findings} == {Reason.BAD_OVERRIDE}
    assert len(result.findings) == len(annotations) - ("override_until" in annotations)


def test_a_lent_node_whose_overrides_cannot_be_read_is_taken_back() -> None:
    node = with_overrides(lend(serving("n"), T0 - HOUR), lend="nevr")

    result = checked(plan([serving("s"), node]))

    assert [(s.node, s.reason) for s in result.steps] == [("n", Reason.BAD_OVERRIDE_RECLAIM)]


def test_unreadable_overrides_lapse_with_a_readable_expiry() -> None:
    until = nodestate.format_time(T0 - MINUTE)
    node = with_overrides(serving("n"), lend="nevr", override_until=until)

    result = checked(plan([node], target=1, pool_policy=policy(min_serving=0)))

    assert stepped(result, LEND) == ["n"]


def test_reclaim_now_keeps_a_node_serving_while_it_is_there() -> None:
    node = with_overrides(serving("n"), reclaim="now")

    result = checked(plan([node, serving("s")], target=2, pool_policy=policy(min_serving=0)))

    assert stepped(result, LEND) == ["s"]
    assert refusals(result) == {Reason.OPERATOR_RECLAIM_NOW: 1}


def test_a_bad_window_override_falls_back_to_the_pool_window() -> None:
    node = with_overrides(lend(serving("n"), T0 - HOUR), window="Mon-Fri 25:00-06:00")

    result = checked(plan([serving("s"), node], pool_policy=policy(window=window(NIGHTS))))

    assert stepped(result, RECLAIM) == ["n"]
    assert [f.key for f in result.findings] == [KEYS.window]


# ---------------------------------------------------------------------------------------------
# Unreadable state


def test_a_node_with_an_unreadable_state_is_taken_back_and_reported() -> None:
    broken = corrupted_original("broken")

    result = checked(plan([*serving_nodes(3), broken, *lent_nodes(1)], rps=None))

    assert stepped(result) == ["broken", "l-00"]
    assert [s.reason for s in result.steps] == [Reason.STATE_UNREADABLE, Reason.METRICS_LOST]
    assert [(f.node, f.key, f.reason) for f in result.findings] == [
        ("broken", KEYS.original, Reason.STATE_UNREADABLE)
    ]


def test_a_node_with_an_unknown_state_label_is_taken_back_and_nothing_is_lent_meanwhile() -> None:
    node = serving("odd")
    odd = model.NodeView(
        name=node.name,
        labels={**node.labels, KEYS.state: "borrowed"},
        taints=node.taints,
    )

    result = checked(plan([serving("s"), odd], target=2, pool_policy=policy(min_serving=0)))

    assert stepped(result, RECLAIM) == ["odd"]
    assert stepped(result, LEND) == []
    assert {r.reason for r in result.rejections} == {Reason.STATE_UNREADABLE}
    assert [(f.node, f.value, f.reason) for f in result.findings] == [
        ("odd", "borrowed", Reason.STATE_UNREADABLE)
    ]


def lend_limits(nodes: list[model.NodeView], pool_policy: PoolPolicy) -> dict[str, str]:
    """The pool's limits on lending the first serving node, each judged on its own (what
    ``explain`` shows), by rule: a limit hidden by another that refuses first still shows."""
    snap = pool_snapshot(nodes, demand(0.0, timedelta(seconds=30), T0), None)
    name = next(n.name for n in nodes if n.name.startswith("s-"))
    rules = planning.node_rules(T0, POOL, snap, pool_policy, KEYS, name)
    limits = (Reason.MIN_SERVING, Reason.MAX_FRACTION, Reason.HEADROOM, Reason.STATE_UNREADABLE)
    return {c.rule.value: c.verdict.value for c in rules.checks if c.rule in limits}


def test_a_node_with_an_unreadable_state_counts_as_away_for_the_lent_fraction() -> None:
    # One lent node and one unreadable: half of 4 are away, so the fraction (the tightest of
    # the capacity rules here) leaves no room.
    nodes = [*serving_nodes(2), corrupted_original("broken"), *lent_nodes(1)]

    limits = lend_limits(nodes, policy(max_lent_fraction=0.5, min_serving=0))

    assert limits == {"state_unreadable": "refuses", "max_fraction": "refuses"}


def test_a_node_with_an_unreadable_state_never_counts_as_serving() -> None:
    # Two serving nodes are all that serve: the unreadable one is not capacity.
    nodes = [*serving_nodes(2), corrupted_original("broken")]

    limits = lend_limits(nodes, policy(min_serving=2))

    assert limits["min_serving"] == "refuses"


def test_nothing_is_lent_while_a_node_is_taken_back_for_a_state_problem() -> None:
    nodes = [*serving_nodes(3), corrupted_original("broken")]

    result = checked(plan(nodes, target=4, pool_policy=policy(min_serving=0)))

    assert stepped(result, RECLAIM) == ["broken"]
    assert stepped(result, LEND) == []
    assert refusals(result) == {Reason.STATE_UNREADABLE: 4}


# ---------------------------------------------------------------------------------------------
# Which lent nodes come back first


def test_reclaims_take_the_nodes_with_the_fewest_borrowed_jobs_first() -> None:
    at = T0 - HOUR
    nodes = [
        serving("s"),
        lend(serving("a-one-job-three-pods"), at, pods=borrowed_pods("j1", "j1", "j1")),
        lend(serving("b-two-jobs"), at, pods=borrowed_pods("j2", "j3")),
        lend(serving("c-empty"), at, pods=()),
        lend(serving("d-one-job-one-pod"), at, pods=borrowed_pods("j4")),
    ]

    two = checked(plan(nodes, target=2))
    three = checked(plan(nodes, target=1))

    assert stepped(two, RECLAIM) == ["c-empty", "d-one-job-one-pod"]
    assert stepped(three, RECLAIM) == ["c-empty", "d-one-job-one-pod", "a-one-job-three-pods"]


def test_safety_reclaims_also_take_the_cheapest_nodes_first() -> None:
    at = T0 - HOUR
    nodes = [
        serving("s"),
        lend(serving("a"), at, pods=borrowed_pods("j1", "j2")),
        lend(serving("b"), at, pods=borrowed_pods("j3")),
    ]

    # 15 rps needs 2 serving nodes.
    result = checked(plan(nodes, rps=15.0))

    assert stepped(result, RECLAIM) == ["b"]


# ---------------------------------------------------------------------------------------------
# Node values planned more than once (the planner caches what it decodes on them)


def test_a_node_derived_with_dataclasses_replace_is_read_afresh() -> None:
    idle = serving("n")
    assert stepped(plan([idle], target=1, pool_policy=policy(min_serving=0))) == ["n"]

    # A value made with ``replace`` must not reuse the parse of the value it came from.
    busy = dataclasses.replace(idle, pods=(inference_pod(),))
    never = dataclasses.replace(idle, annotations={KEYS.lend: "never"})

    assert refusals(plan([busy], target=1, pool_policy=policy(min_serving=0))) == {
        Reason.NOT_IDLE: 1
    }
    assert refusals(plan([never], target=1, pool_policy=policy(min_serving=0))) == {
        Reason.LEND_NEVER: 1
    }


def test_an_override_that_expires_between_ticks_lapses_on_the_same_node_value() -> None:
    node = with_overrides(
        lend(serving("n"), T0 - HOUR), paused="true", override_until="2026-03-02T13:00:00Z"
    )
    nodes = [serving("s"), node]

    before = checked(plan(nodes, target=0))
    after = checked(plan(nodes, target=0, now=T0 + 2 * HOUR))

    assert refusals(before) == {Reason.NODE_PAUSED: 1}
    assert stepped(after, RECLAIM) == ["n"]


def test_the_same_node_values_see_the_window_as_it_is_at_each_tick() -> None:
    nodes = serving_nodes(3)
    nights = policy(window=window(NIGHTS))

    noon = checked(plan(nodes, target=1, pool_policy=nights))
    night = checked(plan(nodes, target=1, pool_policy=nights, now=T0 + 11 * HOUR))
    next_noon = checked(plan(nodes, target=1, pool_policy=nights, now=T0 + 24 * HOUR))

    assert (len(noon.steps), len(night.steps), len(next_noon.steps)) == (0, 1, 0)


@pytest.mark.parametrize("rps", [1e300, 1.7e308, math.inf])
def test_an_absurd_demand_needs_the_whole_pool_and_never_overflows(rps: float) -> None:
    assert model.nodes_needed(rps, 1e-300, 0.2, 2) == model.MAX_NODES
    result = checked(plan([*serving_nodes(2), *lent_nodes(2)], target=2, rps=rps))
    assert stepped(result, RECLAIM) == ["l-00", "l-01"]
