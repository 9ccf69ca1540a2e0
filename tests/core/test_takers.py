"""Lend only to a taker: a node is lent when a pending training job would run on it, a gang's
nodes together or none, never to a job that would land on the wrong GPU (``core.takers`` and
the planner's use of it)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rebalancer.core import model, takers
from rebalancer.core.model import Action, PoolName, Reason, Requirement
from tests.support.factories import (
    KEYS,
    POOL,
    T0,
    TRAINING_TOLERATIONS,
    borrowed_pod,
    daemon_pod,
    demand,
    gpu_node,
    lend,
    plan,
    planned,
    policy,
    pool_snapshot,
    proposal,
    refusals,
    serving,
    stepped,
    taker,
    unaccounted,
    with_overrides,
)

LEND = Action.LEND
TAKERS = policy(lend_only_to_takers=True, min_serving=0, max_step_fraction=1.0)
HOPPER = {"nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.memory": "81559"}
AMPERE = {"nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.memory": "81920"}
ADA_48 = {"nvidia.com/gpu.family": "ada", "nvidia.com/gpu.memory": "46068"}
FP8 = (Requirement("nvidia.com/gpu.family", "In", ("hopper", "blackwell")),)
SEVENTY_GB = (Requirement("nvidia.com/gpu.memory", "Gt", ("70000",)),)


def nodes(count: int, prefix: str = "s", **labels: str) -> list[model.NodeView]:
    return [gpu_node(serving(f"{prefix}-{i}"), **labels) for i in range(count)]


def checked(result: model.PoolPlan) -> model.PoolPlan:
    assert unaccounted(result) == []
    return result


# ---------------------------------------------------------------------------------------------
# The planner


def test_without_a_pending_job_nothing_is_lent_and_the_refusal_says_so() -> None:
    result = checked(plan(nodes(4), target=2, pool_policy=TAKERS))

    assert stepped(result) == []
    assert refusals(result) == {Reason.NO_TAKER: 2}
    assert "no pending pod tolerates the lend taint" in result.rejections[0].message


def test_a_pool_that_lends_to_anyone_still_lends_without_a_job() -> None:
    result = checked(plan(nodes(4), target=2, pool_policy=policy(min_serving=0)))

    assert len(stepped(result, LEND)) == 2


def test_one_pending_pod_of_a_whole_node_takes_one_node() -> None:
    result = checked(plan(nodes(4), target=3, pool_policy=TAKERS, takers=[taker("a")]))

    assert stepped(result, LEND) == ["s-0"]
    assert refusals(result) == {Reason.NO_TAKER: 2}
    assert result.steps[0].taker == "pod:train/a"
    assert "for job pod:train/a" in result.steps[0].message


def test_small_pods_share_one_node() -> None:
    pending = [taker(f"p{i}", gpus=2) for i in range(4)]  # 8 GPUs in all: one node

    result = checked(plan(nodes(4), target=4, pool_policy=TAKERS, takers=pending))

    assert stepped(result, LEND) == ["s-0"]


def test_an_fp8_job_is_never_lent_an_ampere_node() -> None:
    pending = [taker("fp8", affinity=[FP8])]

    on_ampere = checked(plan(nodes(2, **AMPERE), target=2, pool_policy=TAKERS, takers=pending))
    on_hopper = checked(plan(nodes(2, **HOPPER), target=2, pool_policy=TAKERS, takers=pending))

    assert stepped(on_ampere) == []
    assert "node affinity nvidia.com/gpu.family In" in on_ampere.rejections[0].message
    assert stepped(on_hopper, LEND) == ["s-0"]


def test_a_70_gb_model_is_never_lent_a_48_gb_card() -> None:
    pending = [taker("big", affinity=[SEVENTY_GB])]

    small = checked(plan(nodes(2, **ADA_48), target=1, pool_policy=TAKERS, takers=pending))
    large = checked(plan(nodes(2, **HOPPER), target=1, pool_policy=TAKERS, takers=pending))

    assert stepped(small) == []
    assert refusals(small) == {Reason.NO_TAKER: 1}
    assert stepped(large, LEND) == ["s-0"]


def test_the_node_is_judged_as_it_will_be_once_lent() -> None:
    """The lend swaps the inference taint for the lend taint and sets the pool's labels: a job
    that selects on a lend label is a taker, one that does not tolerate the lend taint is not."""
    by_label = taker("by-label", node_selector={"workload": "training"})
    untolerant = taker("untolerant", tolerations=TRAINING_TOLERATIONS[:1])

    yes = checked(plan(nodes(2), target=1, pool_policy=TAKERS, takers=[by_label]))
    no = checked(plan(nodes(2), target=1, pool_policy=TAKERS, takers=[untolerant]))

    assert stepped(yes, LEND) == ["s-0"]
    assert stepped(no) == []
    assert f"does not tolerate {KEYS.lent_taint}=training:NoSchedule" in no.rejections[0].message


def test_what_the_nodes_pods_hold_is_not_room() -> None:
    """Its DaemonSet pods hold 1 of the node's 8 GPUs: a pod of 8 does not fit."""
    busy = dataclasses.replace(daemon_pod(), requests=model.Resources(gpu=1))
    full = [gpu_node(serving(f"s-{i}", pods=[busy])) for i in range(2)]

    result = checked(plan(full, target=1, pool_policy=TAKERS, takers=[taker("a")]))

    assert stepped(result) == []
    assert "asks 8 GPU" in result.rejections[0].message


def test_a_node_whose_allocatable_is_unknown_fits_no_request() -> None:
    unknown = [serving("s-0")]  # no allocatable

    result = checked(plan(unknown, target=1, pool_policy=TAKERS, takers=[taker("a")]))

    assert stepped(result) == []


def test_a_gang_is_lent_all_its_nodes_at_once_or_none() -> None:
    gang = [taker(f"w{i}", job="train/llama") for i in range(4)]

    three = checked(
        plan(nodes(6), target=3, pool_policy=TAKERS, takers=gang)
    )  # room for three of four: lending three would run nothing
    four = checked(plan(nodes(6), target=4, pool_policy=TAKERS, takers=gang))

    assert stepped(three) == []
    assert "needs 4 more nodes at once; 3 may be lent" in three.rejections[0].message
    assert stepped(four, LEND) == ["s-0", "s-1", "s-2", "s-3"]
    assert {s.taker for s in four.steps} == {"train/llama"}


def test_a_gang_that_does_not_fit_leaves_its_nodes_to_the_next_job() -> None:
    gang = [taker(f"w{i}", job="train/big", priority=10) for i in range(4)]
    lone = taker("lone", priority=0)

    result = checked(plan(nodes(6), target=2, pool_policy=TAKERS, takers=[*gang, lone]))

    assert stepped(result, LEND) == ["s-0"]
    assert result.steps[0].taker == "pod:train/lone"


def test_higher_priority_jobs_are_placed_first() -> None:
    low, high = taker("low", priority=1), taker("high", priority=100)

    result = checked(plan(nodes(3), target=1, pool_policy=TAKERS, takers=[low, high]))

    assert [s.taker for s in result.steps] == ["pod:train/high"]


def test_a_job_that_fits_on_a_node_lent_already_is_not_lent_another() -> None:
    """Lent last tick for this job; the scheduler has not placed it yet."""
    lent = gpu_node(lend(serving("l-0"), T0 - timedelta(minutes=1)))

    result = checked(plan([lent, *nodes(3)], target=2, pool_policy=TAKERS, takers=[taker("a")]))

    assert stepped(result) == []
    assert "every pending job (1) fits on nodes lent already" in result.rejections[0].message


def test_a_lent_node_full_of_training_is_no_room() -> None:
    training = dataclasses.replace(borrowed_pod("other"), requests=model.Resources(gpu=8))
    lent = gpu_node(lend(serving("l-0", pods=[training]), T0 - timedelta(minutes=1)))

    result = checked(plan([lent, *nodes(3)], target=2, pool_policy=TAKERS, takers=[taker("a")]))

    assert stepped(result, LEND) == ["s-0"]


def test_an_operators_lend_now_is_not_held_to_a_taker() -> None:
    asked = gpu_node(serving("s-0", annotations={KEYS.lend: "now"}))

    result = checked(plan([asked, *nodes(2, prefix="t")], target=0, pool_policy=TAKERS))

    assert stepped(result, LEND) == ["s-0"]


def test_two_pools_do_not_lend_for_the_same_job() -> None:
    other = PoolName("other")
    pending = (taker("a"),)
    pools = {
        POOL: dataclasses.replace(pool_snapshot(nodes(2), demand(0.0)), takers=pending),
        other: dataclasses.replace(pool_snapshot(nodes(2, "o"), demand(0.0)), takers=pending),
    }
    snapshot = model.Snapshot(now=T0, pools=pools)
    proposals = {POOL: proposal(1), other: proposal(1)}

    result = planned(snapshot, proposals, {POOL: TAKERS, other: TAKERS})

    assert [s.node for s in result.steps] == ["s-0"]
    assert refusals(result.pools[other]) == {Reason.NO_TAKER: 1}


def test_safety_rules_still_come_first() -> None:
    """A job waits, but demand needs every node: nothing is lent for it."""
    result = checked(plan(nodes(4), target=2, rps=400.0, pool_policy=TAKERS, takers=[taker("a")]))

    assert stepped(result) == []
    assert Reason.NO_TAKER not in refusals(result)


# ---------------------------------------------------------------------------------------------
# Matching, one operator at a time (k8s.io/api/core/v1 semantics)


@pytest.mark.parametrize(
    ("operator", "values", "labels", "expected"),
    [
        ("In", ("a", "b"), {"k": "b"}, True),
        ("In", ("a",), {}, False),
        ("NotIn", ("a",), {"k": "b"}, True),
        ("NotIn", ("a",), {}, True),
        ("NotIn", ("a",), {"k": "a"}, False),
        ("Exists", (), {"k": ""}, True),
        ("Exists", (), {}, False),
        ("DoesNotExist", (), {}, True),
        ("DoesNotExist", (), {"k": "x"}, False),
        ("Gt", ("70000",), {"k": "81920"}, True),
        ("Gt", ("70000",), {"k": "46068"}, False),
        ("Gt", ("70000",), {"k": "70000"}, False),
        ("Lt", ("9",), {"k": "8"}, True),
        ("Gt", ("1",), {"k": "eight"}, False),  # a label that is no number never matches
        ("Gt", ("1",), {}, False),
        ("Sideways", ("1",), {"k": "1"}, False),  # an operator the API does not know
    ],
)
def test_each_operator(
    operator: str, values: tuple[str, ...], labels: dict[str, str], expected: bool
) -> None:
    assert takers.matches(Requirement("k", operator, values), labels) is expected


def test_affinity_terms_are_ored_and_their_requirements_anded() -> None:
    pod = taker(
        "p",
        affinity=[
            [Requirement("a", "Exists"), Requirement("b", "Exists")],
            [Requirement("c", "Exists")],
        ],
    )

    assert takers.accepts(pod, {"a": "", "b": ""}, ()) is None
    assert takers.accepts(pod, {"c": ""}, ()) is None
    assert takers.accepts(pod, {"a": ""}, ()) is not None


def test_a_prefer_no_schedule_taint_never_blocks() -> None:
    soft = model.Taint(key="soft", effect="PreferNoSchedule")

    assert takers.accepts(taker("p"), {}, (soft,)) is None


# ---------------------------------------------------------------------------------------------
# Properties of ``place``


SIZES = st.lists(st.integers(min_value=1, max_value=8), min_size=0, max_size=12)


@given(sizes=SIZES, jobs=st.integers(min_value=1, max_value=4), budget=st.integers(0, 6))
def test_no_gang_is_ever_lent_part_of_its_nodes(sizes: list[int], jobs: int, budget: int) -> None:
    pods = [taker(f"p{i}", gpus=g, job=f"j{i % jobs}") for i, g in enumerate(sizes)]
    offered = [takers.Room(n.name, n.labels, n.taints, n.allocatable) for n in nodes(6, **HOPPER)]

    placed = takers.place(takers.gangs(pods), (), offered, budget)

    assert len(placed.lend) <= budget
    lent_for = {job for _, job in placed.lend}
    for gang in takers.gangs(pods):  # every job placed whole, or waiting with a reason
        assert (gang.key in lent_for) != (gang.key in placed.waiting)
    placed_gpus = sum(p.requests.gpu for p in pods if p.job in lent_for)
    assert placed_gpus <= 8 * len(placed.lend)


# ---------------------------------------------------------------------------------------------
# A loan no job uses is given back


def lent_ago(name: str, ago: timedelta) -> model.NodeView:
    return gpu_node(lend(serving(name), T0 - ago))


def test_a_loan_no_job_uses_is_given_back_once_unused_long_enough() -> None:
    old, new = lent_ago("old", timedelta(minutes=10)), lent_ago("new", timedelta(minutes=1))

    result = checked(plan([old, new], target=2, pool_policy=TAKERS))

    assert stepped(result, Action.RECLAIM) == ["old"]
    assert result.steps[0].reason is Reason.UNUSED_LOAN


def test_a_loan_a_pending_job_would_take_is_kept() -> None:
    old = lent_ago("old", timedelta(minutes=10))

    result = checked(plan([old], target=1, pool_policy=TAKERS, takers=[taker("a")]))

    assert stepped(result) == []


def test_a_loan_training_runs_on_is_kept() -> None:
    busy = gpu_node(lend(serving("busy"), T0 - timedelta(hours=1), pods=[borrowed_pod("j")]))

    assert stepped(checked(plan([busy], target=1, pool_policy=TAKERS))) == []


def test_unused_loans_are_kept_where_a_pool_lends_to_anyone() -> None:
    old = lent_ago("old", timedelta(minutes=10))

    result = checked(plan([old], target=1, pool_policy=policy(min_serving=0)))

    assert stepped(result) == []


def test_an_operators_loan_is_kept_unused() -> None:
    asked = with_overrides(lent_ago("asked", timedelta(hours=1)), lend="now")

    result = checked(plan([asked], target=1, pool_policy=TAKERS))

    assert stepped(result) == []
    assert refusals(result) == {Reason.OPERATOR_LEND_NOW: 1}


def test_a_gang_larger_than_the_per_tick_limit_is_still_lent_whole() -> None:
    """Two strategy moves a tick (a quarter of 8 nodes): a job of four would otherwise wait
    for ever. It is lent its four nodes in one tick; lone jobs stay held to two."""
    limited = policy(lend_only_to_takers=True, min_serving=0, max_step_fraction=0.25)
    gang = [taker(f"w{i}", job="train/four") for i in range(4)]
    lone = [taker(f"lone-{i}", priority=-1) for i in range(3)]

    four = checked(plan(nodes(8), target=8, pool_policy=limited, takers=gang))
    singles = checked(plan(nodes(8), target=8, pool_policy=limited, takers=lone))

    assert len(stepped(four, LEND)) == 4
    assert {s.taker for s in four.steps} == {"train/four"}
    assert len(stepped(singles, LEND)) == 2
    assert refusals(singles)[Reason.RATE_LIMIT] == 6


def test_a_gang_no_node_would_accept_does_not_lift_the_per_tick_limit() -> None:
    limited = policy(lend_only_to_takers=True, min_serving=0, max_step_fraction=0.25)
    hopper_gang = [taker(f"h{i}", job="train/fp8", affinity=[FP8]) for i in range(4)]
    lone = [taker(f"lone-{i}") for i in range(3)]

    result = checked(plan(nodes(8), target=8, pool_policy=limited, takers=[*hopper_gang, *lone]))

    assert len(stepped(result, LEND)) == 2
