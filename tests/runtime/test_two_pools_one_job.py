"""Two pools, one pending job: the job is lent one node, by one pool, not a node by each.

Both pools lend only to takers (the settings' default) and both lend taints are ones the waiting
pod tolerates, so either pool's idle node would take it. The Reconciler plans every pool in one
tick (``core.tick.plan_tick``); the jobs a pool planned first has room for, lent this tick or
already, are no reason for the next pool to lend. A second node lent for a job of one pod is a
GPU node taken from inference for nothing, and one more to take back when traffic rises.

The fakes (``tests.support.fakes``) stand in for the seams, as in ``test_multi_pool``: the nodes
are views that each pool's ``CodecActuator`` moves through the node-state codec, the pending pod
is one the informer would list, the audit store is the in-memory one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from rebalancer.adapters import registry
from rebalancer.adapters.audit import AuditLog, MemoryAuditStore, UlidFactory
from rebalancer.core import model, nodestate
from rebalancer.core.audit import Kind
from rebalancer.core.model import Action, PodMarks, PoolName, Reason
from rebalancer.core.policy import PoolPolicy
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.report import TickReport
from rebalancer.runtime.seams import AlwaysLeader, PoolConfig
from sandbox.emulator.clock import ManualClock
from tests.support.factories import INFERENCE_TAINT, KEYS, T0, gpu_node, serving, taker
from tests.support.fakes import CodecActuator, Demand, Scripted, Views

CHAT, BATCH = PoolName("chat"), PoolName("batch")
JOB = "pod:train/a"  # how the planner names the job of a pending pod without one


def spec(value: str) -> nodestate.LendSpec:
    lent = model.Taint(key=KEYS.lent_taint, value=value, effect="NoSchedule")
    return nodestate.LendSpec(remove_taints=(INFERENCE_TAINT,), add_taints=(lent,))


def policy(lend_spec: nodestate.LendSpec) -> PoolPolicy:
    # Any idle node may be lent at once: only the want of a taker can hold a lend back.
    return PoolPolicy(
        rps_per_node=10.0,
        min_serving=0,
        headroom=0.0,
        cooldown=timedelta(0),
        max_step_fraction=1.0,
        warmup=timedelta(0),
        lend_only_to_takers=True,
        lend_spec=lend_spec,
    )


POLICIES = {CHAT: policy(spec("chat")), BATCH: policy(spec("batch"))}


def pool_node(name: str, pool: PoolName) -> model.NodeView:
    return gpu_node(serving(name), pool=str(pool))


def config(name: PoolName, strategy: Any = None) -> PoolConfig:
    pool_policy = POLICIES[name]
    return PoolConfig(
        name=name,
        node_selector={"pool": str(name)},
        policy=pool_policy,
        marks=PodMarks(
            lend_taints=pool_policy.lend_spec.add_taints, serving_taints=(INFERENCE_TAINT,)
        ),
        strategy=strategy or registry.build("reactive"),
        strategy_name=getattr(strategy, "name", "reactive"),
    )


@dataclass
class World:
    reconciler: Reconciler
    views: Views
    clock: ManualClock
    actuators: Mapping[PoolName, CodecActuator]
    audit: MemoryAuditStore

    async def tick(self) -> TickReport:
        return await self.reconciler.tick()

    def lent(self) -> dict[PoolName, list[str]]:
        return {pool: actuator.of("lend") for pool, actuator in self.actuators.items()}


def world(
    nodes: Sequence[model.NodeView],
    waiting: Sequence[model.PendingPod],
    chat_strategy: Any = None,
) -> World:
    clock = ManualClock(T0)
    views = Views(list(nodes), waiting=list(waiting))
    actuators = {
        pool: CodecActuator(views, p.lend_spec, clock, KEYS) for pool, p in POLICIES.items()
    }
    audit = MemoryAuditStore()
    reconciler = Reconciler(
        [config(CHAT, chat_strategy), config(BATCH)],
        observer=Observer(
            [config(CHAT, chat_strategy), config(BATCH)],
            views=views,
            metrics=Demand({CHAT: 0.0, BATCH: 0.0}, clock),
            keys=KEYS,
        ),
        clock=clock,
        actuators=actuators,
        audit_log=AuditLog(audit, sink=None, new_id=UlidFactory(clock)),
        leadership=AlwaysLeader(now=clock),
        keys=KEYS,
    )
    return World(reconciler, views, clock, actuators, audit)


# ---------------------------------------------------------------------------------------------


async def test_one_pending_job_that_both_pools_would_take_is_lent_one_node_by_one_pool() -> None:
    nodes = [pool_node("chat-0", CHAT), pool_node("chat-1", CHAT)]
    nodes += [pool_node("batch-0", BATCH), pool_node("batch-1", BATCH)]
    # One pod of a whole node, tolerating every lent taint (``rebalancer.io/lent`` Exists).
    w = world(nodes, [taker("a")])
    assert all(
        model.tolerates(w.views.waiting[0].tolerations, t)
        for p in POLICIES.values()
        for t in p.lend_spec.add_taints
    )

    first = await w.tick()

    assert w.lent() == {CHAT: ["chat-0"], BATCH: []}
    [step] = first.plan.steps
    assert (step.pool, step.taker) == (CHAT, JOB)
    # batch's lend is refused, and the refusal is audited: it is not silent.
    batch = first.plan.pools[BATCH]
    assert {r.reason for r in batch.rejections} == {Reason.NO_TAKER}
    refused = [r for r in w.audit.records if r.kind is Kind.REFUSAL and r.pool == BATCH]
    assert refused
    assert {r.reason for r in refused} == {Reason.NO_TAKER.value}

    # The pod is not scheduled yet (nothing places it in this world): chat's lent node still
    # has room for it, and that room is not a reason for batch to lend one now either.
    w.clock.advance(30)
    second = await w.tick()

    assert not [s for s in second.plan.steps if s.action is Action.LEND]
    assert w.lent() == {CHAT: ["chat-0"], BATCH: []}
    assert JOB in second.plan.pools[CHAT].served


async def test_a_job_each_pool_alone_would_take_gets_a_node_from_each() -> None:
    """The rule is per job, not per tick: two waiting jobs are lent a node each, one by each
    pool where one pool's idle nodes suit only one of them."""
    nodes = [pool_node("chat-0", CHAT), pool_node("batch-0", BATCH)]
    a = taker("a", node_selector={"pool": "chat"})
    b = taker("b", node_selector={"pool": "batch"})
    w = world(nodes, [a, b])

    await w.tick()

    assert w.lent() == {CHAT: ["chat-0"], BATCH: ["batch-0"]}


@pytest.mark.parametrize(
    "second",
    [
        model.Proposal(1, "hold the one lent"),
        ZeroDivisionError("float division by zero"),  # safety only: hold what is lent
    ],
    ids=["chat-holds", "chat-strategy-fails"],
)
async def test_room_lent_before_is_the_jobs_while_the_pool_that_lent_it_lends_no_more(
    second: object,
) -> None:
    """chat lent a node for the job last tick and asks for no more now: the job, still waiting
    for the scheduler, has room on chat's node, so batch lends nothing for it."""
    nodes = [pool_node("chat-0", CHAT), pool_node("chat-1", CHAT)]
    nodes += [pool_node("batch-0", BATCH), pool_node("batch-1", BATCH)]
    chat = Scripted(model.Proposal(1, "lend one"))
    w = world(nodes, [taker("a")], chat_strategy=chat)
    await w.tick()
    assert w.lent() == {CHAT: ["chat-0"], BATCH: []}

    chat.answer = second
    w.clock.advance(30)
    report = await w.tick()

    assert w.lent() == {CHAT: ["chat-0"], BATCH: []}
    assert JOB in report.plan.pools[CHAT].served
    assert {r.reason for r in report.plan.pools[BATCH].rejections} == {Reason.NO_TAKER}
