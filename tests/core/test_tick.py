"""``core.tick``: one tick's decision from the strategies' answers, the same for the controller
and the simulator; and the operator's reclaim as a plan."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta
from typing import Any

import pytest

from rebalancer.core import model, tick
from rebalancer.core.model import Action, Origin, PoolName, Reason
from rebalancer.core.tick import Failure, FailureKind, PoolControls, Stage, plan_tick
from tests.support import factories as f

A, B = PoolName("a"), PoolName("b")


def snapshot(rps: float = 0.0) -> model.Snapshot:
    pools = {
        A: f.pool_snapshot(
            [*f.serving_nodes(3, "a"), *f.lent_nodes(2, prefix="al")], f.demand(rps)
        ),
        B: f.pool_snapshot(
            [*f.serving_nodes(3, "b"), *f.lent_nodes(2, prefix="bl")], f.demand(rps)
        ),
    }
    return model.Snapshot(now=f.T0, pools=pools)


CONTROLS = {A: PoolControls(f.policy()), B: PoolControls(f.policy())}


def test_a_valid_answer_is_planned_as_given() -> None:
    decision = plan_tick(snapshot(), {A: f.proposal(4), B: f.proposal(2)}, CONTROLS, f.KEYS)
    assert decision.failures == {}
    assert decision.proposals[A] == f.proposal(4)
    assert len(f.stepped(decision.plan.pools[A], Action.LEND)) == 2
    assert f.stepped(decision.plan.pools[B]) == []


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (Failure(FailureKind.TIMEOUT, "no answer within 0:00:10"), FailureKind.TIMEOUT),
        (Failure.raised(ZeroDivisionError("boom")), FailureKind.RAISED),
        (model.Proposal(-1, "negative"), FailureKind.INVALID),
        (model.Proposal(99, "more than the pool"), FailureKind.INVALID),
        # A float where an int belongs, as a buggy strategy could answer: the type is the point.
        (model.Proposal(math.nan, "nan"), FailureKind.INVALID),  # type: ignore[arg-type]
        ("four", FailureKind.INVALID),
        (None, FailureKind.INVALID),
    ],
)
def test_a_failed_or_invalid_answer_holds_what_is_lent_in_that_pool_only(
    answer: Any, kind: FailureKind
) -> None:
    decision = plan_tick(snapshot(), {A: answer, B: f.proposal(4)}, CONTROLS, f.KEYS)
    failure = decision.failures[(A, Stage.STRATEGY)]
    assert failure.kind is kind
    held = decision.proposals[A]
    assert held.lend_target == 2  # safety only: what is lent, no new loan
    assert "safety only" in held.reason
    assert f.stepped(decision.plan.pools[A]) == []
    # The other pool is planned from its own answer.
    assert (B, Stage.STRATEGY) not in decision.failures
    assert len(f.stepped(decision.plan.pools[B], Action.LEND)) == 2


def test_a_failed_answer_still_lets_the_safety_rules_reclaim() -> None:
    # Demand needs every node: the safety-only pool still takes its loans back.
    decision = plan_tick(
        snapshot(rps=50.0), {A: Failure.raised(OSError()), B: f.proposal(0)}, CONTROLS, f.KEYS
    )
    reclaimed = decision.plan.pools[A].steps
    assert {s.action for s in reclaimed} == {Action.RECLAIM}
    assert {s.intent.origin for s in reclaimed} == {Origin.SAFETY}


def test_a_planner_that_fails_in_one_pool_moves_nothing_there_and_leaves_the_other() -> None:
    # Not a policy at all, so the planner itself raises for pool A: the failure under test.
    broken = {A: PoolControls(object()), B: PoolControls(f.policy())}  # type: ignore[arg-type]
    decision = plan_tick(snapshot(), {A: f.proposal(4), B: f.proposal(4)}, broken, f.KEYS)
    failure = decision.failures[(A, Stage.PLANNER)]
    assert failure.kind is FailureKind.RAISED
    assert failure.error == "AttributeError"
    a = decision.plan.pools[A]
    assert (a.steps, a.rejections) == ((), ())
    assert "nothing moves" in a.summary
    assert len(f.stepped(decision.plan.pools[B], Action.LEND)) == 2


def test_the_lent_count_is_the_nodes_lending_or_lent() -> None:
    pool = snapshot().pools[A]
    assert tick.lent_count(pool, f.KEYS, f.LEND_SPEC.add_taints) == 2


def test_the_fallback_holds_a_serving_node_that_carries_a_lent_taint_as_the_planner_counts_it() -> (
    None
):
    # Another writer wiped the state of a lent node but left the lent taint: the node reads as
    # serving, and only the pool's lent taints tell that its original is lost.
    wiped = f.serving("a-wiped")
    marked = dataclasses.replace(wiped, taints=(*wiped.taints, *f.LEND_SPEC.add_taints))
    nodes = [*f.serving_nodes(3, "a"), *f.lent_nodes(2, prefix="al"), marked]
    seen = model.Snapshot(now=f.T0, pools={A: f.pool_snapshot(nodes, f.demand(0.0))})
    controls = {A: PoolControls(f.policy(lend_spec=f.LEND_SPEC))}
    lent = tick.lent_count(seen.pools[A], f.KEYS, f.LEND_SPEC.add_taints)
    assert lent == 3  # two lent, and the one whose original is lost

    failed = plan_tick(seen, {A: Failure.raised(ZeroDivisionError("boom"))}, controls, f.KEYS)

    assert failed.proposals[A].lend_target == lent, "hold what is lent, counted as planned"
    assert "3 lent (1 of them unreadable)" in failed.plan.pools[A].summary
    strategy_steps = [s for s in failed.plan.pools[A].steps if s.intent.origin is Origin.STRATEGY]
    assert strategy_steps == [], "the fallback gives back no loan"


WARMUP, HOUR = timedelta(minutes=5), timedelta(hours=1)


@pytest.mark.parametrize(
    ("away", "queued", "costs"),
    [
        pytest.param(["lent", "lent"], 11.0, 2, id="queued beyond the limit with nodes lent"),
        pytest.param([], 11.0, 0, id="queued with nothing lent: not lending's cost"),
        pytest.param(["lent", "lent"], 10.0, 0, id="at the limit"),
        pytest.param(["lent", "lent"], None, 0, id="queue unknown"),
        pytest.param(["lending", "reclaiming"], 11.0, 2, id="on their way out and back"),
        pytest.param(["warming"], 11.0, 1, id="back from a loan, within the warm-up"),
        pytest.param(["warm"], 11.0, 0, id="back from a loan, warm: no longer away"),
    ],
)
def test_lending_costs_a_pool_when_requests_queue_beyond_its_limit_while_nodes_are_away(
    away: list[str], queued: float | None, costs: int
) -> None:
    now = f.T0
    made = {
        "lent": lambda n: f.lend(f.serving(n), now - HOUR),
        "lending": lambda n: f.lending(f.serving(n), now),
        "reclaiming": lambda n: f.begin_reclaim(f.lend(f.serving(n), now - HOUR), now),
        "warming": lambda n: f.returned(n, now - HOUR, now - WARMUP + timedelta(seconds=1)),
        "warm": lambda n: f.returned(n, now - HOUR, now - WARMUP),
    }
    nodes = [made[kind](f"a-{i}") for i, kind in enumerate(away)]
    queue = None if queued is None else f.demand(queued)
    pool = f.pool_snapshot([*f.serving_nodes(3), *nodes], f.demand(5.0), queue)
    policy = f.policy(queue_limit=10.0, warmup=WARMUP)
    assert tick.nodes_lending_costs(pool, policy, f.KEYS, now) == costs


def test_an_operator_reclaim_is_one_urgent_operator_step_per_node() -> None:
    plan = tick.operator_reclaims(
        f.T0,
        {A: [model.NodeName("al-0")], B: [model.NodeName("bl-0"), model.NodeName("bl-1")]},
        "op",
    )
    steps = plan.steps
    assert [(s.pool, s.node) for s in steps] == [(A, "al-0"), (B, "bl-0"), (B, "bl-1")]
    for s in steps:
        assert s.action is Action.RECLAIM
        assert s.urgent
        assert s.reason is Reason.OPERATOR_RECLAIM_NOW
        assert s.intent.origin is Origin.OPERATOR
        assert s.intent.node == s.node
    assert plan.rejections == ()
