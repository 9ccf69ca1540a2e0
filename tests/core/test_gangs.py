"""Gangs on reclaim: a job loses all its pods as soon as it loses one, so the planner takes
back first the nodes that preempt the fewest jobs not lost already (a gang's other nodes cost
nothing more), and brings back with a node every other lent node of the jobs it preempts:
no gang is left half-running (``planning.steps.reclaim_order`` and
``planning.intents.gang_intent``)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from rebalancer.core import model
from rebalancer.core.model import Action, Reason
from tests.support.factories import (
    T0,
    begin_reclaim,
    borrowed_pod,
    lend,
    plan,
    policy,
    refusals,
    serving,
    stepped,
    unaccounted,
    with_overrides,
)

RECLAIM = Action.RECLAIM
CHURN = policy(min_serving=0, max_step_fraction=1.0)
HOUR = timedelta(hours=1)


def running(job: str, index: int, priority: int = 0, age: timedelta = HOUR) -> model.PodView:
    """A pod of ``job`` running on a lent node since ``age`` ago."""
    pod = borrowed_pod(job, index)
    return dataclasses.replace(pod, priority=priority, created=T0 - age)


def lent_with(name: str, *pods: model.PodView) -> model.NodeView:
    return lend(serving(name), T0 - 2 * HOUR, pods=pods)


def checked(result: model.PoolPlan) -> model.PoolPlan:
    assert unaccounted(result) == []
    return result


def test_a_reclaim_takes_a_gangs_nodes_before_preempting_another_job() -> None:
    """Three nodes back: the gang of three costs one job, three lone jobs would cost three."""
    gang = [lent_with(f"g-{i}", running("gang", i)) for i in range(3)]
    lone = [lent_with(f"l-{i}", running(f"lone-{i}", 0, age=2 * HOUR)) for i in range(3)]

    result = checked(plan([*lone, *gang], target=3, pool_policy=CHURN))

    assert sorted(stepped(result, RECLAIM)) == ["g-0", "g-1", "g-2"]


def test_among_single_jobs_the_cheapest_goes_first() -> None:
    """Lowest priority first, then the least work lost (the youngest)."""
    nodes = [
        lent_with("important", running("a", 0, priority=100)),
        lent_with("old", running("b", 0, age=5 * HOUR)),
        lent_with("young", running("c", 0, age=HOUR)),
    ]

    result = checked(plan(nodes, target=2, pool_policy=CHURN))

    assert stepped(result, RECLAIM) == ["young"]


def test_a_node_taken_back_brings_back_the_other_nodes_of_its_gang() -> None:
    """Demand needs one node back; the cheapest runs part of a gang of three: the gang's other
    two nodes come back too, so the job is not left running on two of its three nodes."""
    gang = [lent_with(f"g-{i}", running("gang", i)) for i in range(3)]
    lone = lent_with("lone", running("lone", 0, priority=100))

    result = checked(plan([*gang, lone], target=3, pool_policy=CHURN))

    assert stepped(result, RECLAIM) == ["g-0", "g-1", "g-2"]
    gang_steps = [s for s in result.steps if s.reason is Reason.GANG_PREEMPTED]
    assert [s.node for s in gang_steps] == ["g-1", "g-2"]
    assert gang_steps[0].urgent
    assert "job gang is losing pods" in gang_steps[0].message


def test_a_gang_half_taken_back_before_a_restart_is_taken_back_whole() -> None:
    """A node on its way back still runs a pod of the gang: its other lent node follows, even
    with nothing else asking for a reclaim."""
    back = begin_reclaim(lent_with("g-0", running("gang", 0)), T0 - timedelta(seconds=10))
    rest = lent_with("g-1", running("gang", 1))
    other = lent_with("x", running("other", 0))

    result = checked(plan([back, rest, other], target=2, pool_policy=CHURN))

    assert stepped(result, RECLAIM) == ["g-1"]
    assert result.steps[0].reason is Reason.GANG_PREEMPTED


def test_a_node_an_operator_paused_keeps_its_part_of_a_gang() -> None:
    """The operator's pause outranks the rule, and the refusal says so."""
    gang = [lent_with(f"g-{i}", running("gang", i)) for i in range(2)]
    paused = with_overrides(gang[1], paused="true")

    result = checked(plan([gang[0], paused], target=1, pool_policy=CHURN))

    assert stepped(result, RECLAIM) == ["g-0"]
    assert refusals(result) == {Reason.NODE_PAUSED: 1}


def test_jobs_that_share_no_node_with_a_reclaim_are_left_alone() -> None:
    nodes = [
        lent_with("a", running("j1", 0)),
        lent_with("b", running("j2", 0, priority=5)),
    ]

    result = checked(plan(nodes, target=1, pool_policy=CHURN))

    assert stepped(result, RECLAIM) == ["a"]
    assert not any(s.reason is Reason.GANG_PREEMPTED for s in result.steps)
