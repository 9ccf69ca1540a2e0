"""The reclaim notice through the Reconciler: a strategy's reclaim is carried out as a notice,
the ticks after it drive the node on until its reclaim is done, and a strategy that wants the
node lent again withdraws the notice (docs/design/reclaim-notice.md).

The fakes stand in for the seams, as in ``test_multi_pool``: the nodes are views the pool's
``CodecActuator`` moves through the node-state codec (its pods answer a notice at once), the
audit store is the in-memory one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta

from rebalancer.adapters.audit import AuditLog, MemoryAuditStore, UlidFactory
from rebalancer.core import model, nodestate
from rebalancer.core.audit import Kind
from rebalancer.core.model import Action, PodMarks, PoolName
from rebalancer.core.policy import PoolPolicy
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.seams import AlwaysLeader, PoolConfig
from sandbox.emulator.clock import ManualClock
from tests.support.factories import (
    INFERENCE_TAINT,
    KEYS,
    LEND_SPEC,
    T0,
    borrowed_pod,
    lend,
    serving,
)
from tests.support.fakes import CodecActuator, Demand, Scripted, Views

POOL = PoolName("gpu")
NOTICE = timedelta(minutes=5)
POLICY = PoolPolicy(
    rps_per_node=10.0,
    min_serving=0,
    headroom=0.0,
    cooldown=timedelta(0),
    max_step_fraction=1.0,
    warmup=timedelta(0),
    reclaim_notice=NOTICE,
    lend_spec=LEND_SPEC,
)


@dataclass
class World:
    reconciler: Reconciler
    views: Views
    clock: ManualClock
    actuator: CodecActuator
    audit: MemoryAuditStore
    strategy: Scripted


def world(nodes: list[model.NodeView]) -> World:
    clock = ManualClock(T0)
    views = Views(nodes)
    actuator = CodecActuator(views, LEND_SPEC, clock, KEYS)
    strategy = Scripted(model.Proposal(1, "keep one lent"))
    pool = PoolConfig(
        name=POOL,
        node_selector={"pool": "gpu"},
        policy=POLICY,
        marks=PodMarks(lend_taints=LEND_SPEC.add_taints, serving_taints=(INFERENCE_TAINT,)),
        strategy=strategy,
        strategy_name="scripted",
    )
    audit = MemoryAuditStore()
    reconciler = Reconciler(
        [pool],
        observer=Observer([pool], views=views, metrics=Demand({POOL: 0.0}, clock), keys=KEYS),
        clock=clock,
        actuators={POOL: actuator},
        audit_log=AuditLog(audit, sink=None, new_id=UlidFactory(clock)),
        leadership=AlwaysLeader(now=clock),
        keys=KEYS,
    )
    return World(reconciler, views, clock, actuator, audit, strategy)


def lent(name: str) -> model.NodeView:
    pod = dataclasses.replace(borrowed_pod(name), created=T0 - timedelta(hours=1))
    return lend(serving(name), T0 - timedelta(hours=2), pods=[pod])


def state(w: World, name: str) -> nodestate.NodeState:
    read = nodestate.read(w.views.get(name), KEYS)
    assert isinstance(read, nodestate.NodeState)
    return read


async def test_a_strategy_reclaim_is_a_notice_driven_on_until_the_node_serves() -> None:
    w = world([lent("a"), lent("b")])

    first = await w.reconciler.tick()

    (step,) = first.plan.steps
    assert (step.action, step.notice) == (Action.RECLAIM, NOTICE)
    assert w.actuator.of("notice") == [step.node]
    told = state(w, step.node)
    assert told.noticed
    assert told.deadline == T0 + NOTICE
    (intent,) = [r for r in w.audit.records if r.kind is Kind.INTENT]
    assert intent.detail["notice_seconds"] == NOTICE.total_seconds()

    w.clock.advance(30)
    second = await w.reconciler.tick()

    assert second.plan.steps == ()  # the node under notice is not a kept loan: nothing more
    assert w.actuator.of("progress") == [step.node]
    assert state(w, step.node).phase is nodestate.Phase.SERVING


async def test_a_strategy_that_wants_the_node_again_withdraws_its_notice() -> None:
    w = world([lent("a"), lent("b")])
    await w.reconciler.tick()
    (told,) = w.actuator.of("notice")
    w.strategy.answer = model.Proposal(2, "keep both lent")
    w.actuator.answering = False  # its pods are still saving: the notice runs on

    w.clock.advance(30)
    again = await w.reconciler.tick()

    assert [(s.node, s.action) for s in again.plan.steps] == [(told, Action.WITHDRAW)]
    after = state(w, told)
    assert (after.phase, after.noticed) == (nodestate.Phase.LENT, False)
    assert w.actuator.of("lend") == []
