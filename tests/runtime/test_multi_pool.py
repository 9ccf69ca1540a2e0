"""Two pools in one Reconciler: each is planned on its own demand, policy and lend spec, and acted
on through its own actuator, in the same tick.

``chat`` selects ``pool=chat`` (10 rps a node, at least 1 serving, loans back within 2 minutes,
and lending relabels a node ``pool=lent``); ``batch`` selects ``accelerator=l20`` (50 rps a node,
at least 2 serving, 10 minutes to take a loan back, and lending labels it ``workload=batch``).
The fakes (``tests.support.fakes``) stand in for the seams: the nodes are views that each pool's
``CodecActuator`` moves through the node-state codec, demand is set per pool, the audit store is
the in-memory one. A tick here touches no network; what is checked is what the nodes became and
what the audit log says, pool by pool.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from rebalancer.adapters import registry
from rebalancer.adapters.audit import AuditLog, MemoryAuditStore, UlidFactory
from rebalancer.core import model, nodestate
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import Action, PodMarks, PoolName, Reason
from rebalancer.core.outcomes import ActionResult, Outcome
from rebalancer.core.policy import PoolPolicy
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.report import TickReport
from rebalancer.runtime.seams import AlwaysLeader, PoolConfig
from sandbox.emulator.clock import ManualClock
from tests.support.factories import (
    INFERENCE_TAINT,
    KEYS,
    T0,
    borrowed_pod,
    inference_pod,
    lend,
    serving,
)
from tests.support.fakes import CodecActuator, Demand, Scripted, Views
from tests.support.observers import Seen

CHAT, BATCH = PoolName("chat"), PoolName("batch")
CHAT_SPEC = nodestate.LendSpec(
    remove_taints=(INFERENCE_TAINT,),
    add_taints=(model.Taint(key=KEYS.lent_taint, value="training", effect="NoSchedule"),),
    # The label the pool selects on changes too: a lent node is still chat's by its originals.
    labels={"pool": "lent", "workload": "training"},
)
BATCH_SPEC = nodestate.LendSpec(
    remove_taints=(INFERENCE_TAINT,),
    add_taints=(model.Taint(key=KEYS.lent_taint, value="batch", effect="NoSchedule"),),
    labels={"workload": "batch"},
)
SAME: dict[str, Any] = {
    "headroom": 0.0,
    "cooldown": timedelta(0),
    "max_step_fraction": 1.0,
    "warmup": timedelta(0),
}
CHAT_POLICY = PoolPolicy(
    rps_per_node=10.0,
    min_serving=1,
    reclaim_deadline=timedelta(minutes=2),
    lend_spec=CHAT_SPEC,
    **SAME,
)
BATCH_POLICY = PoolPolicy(
    rps_per_node=50.0,
    min_serving=2,
    reclaim_deadline=timedelta(minutes=10),
    lend_spec=BATCH_SPEC,
    **SAME,
)
CHAT_NODES = [f"chat-{i}" for i in range(4)]
BATCH_NODES = [f"batch-{i}" for i in range(4)]
POOL_OF = {**dict.fromkeys(CHAT_NODES, CHAT), **dict.fromkeys(BATCH_NODES, BATCH)}
EARLIER = T0 - timedelta(hours=1)  # when the nodes that start lent were lent


def node(name: str, labels: Mapping[str, str]) -> model.NodeView:
    view = serving(name)
    return dataclasses.replace(view, labels={**view.labels, **labels})


def chat_node(i: int) -> model.NodeView:
    return node(f"chat-{i}", {"pool": "chat", "accelerator": "h100"})


def batch_node(i: int) -> model.NodeView:
    return node(f"batch-{i}", {"pool": "batch", "accelerator": "l20"})


def lent(view: model.NodeView, spec: nodestate.LendSpec) -> model.NodeView:
    """Lent an hour ago, with a borrowed training pod on it now."""
    return lend(view, EARLIER, spec, pods=(borrowed_pod(f"job-{view.name}"),))


def config(
    name: PoolName,
    selector: Mapping[str, str],
    policy: PoolPolicy,
    strategy: Any = None,
    paused: bool = False,
) -> PoolConfig:
    return PoolConfig(
        name=name,
        node_selector=selector,
        policy=policy,
        marks=PodMarks(lend_taints=policy.lend_spec.add_taints, serving_taints=(INFERENCE_TAINT,)),
        strategy=strategy or registry.build("reactive"),
        strategy_name=getattr(strategy, "name", "reactive"),
        paused=paused,
    )


@dataclass
class World:
    reconciler: Reconciler
    views: Views
    demand: Demand
    clock: ManualClock
    actuators: dict[PoolName, CodecActuator]
    audit: MemoryAuditStore
    seen: Seen
    originals: dict[str, model.NodeView]

    async def tick(self) -> TickReport:
        return self.seen.record(await self.reconciler.tick())

    def records(self, kind: Kind, pool: PoolName | None = None) -> list[AuditRecord]:
        return [
            r for r in self.audit.records if r.kind is kind and (pool is None or r.pool == pool)
        ]

    def phase(self, name: str) -> nodestate.Phase:
        state = nodestate.read(self.views.get(name), KEYS)
        assert isinstance(state, nodestate.NodeState), state
        return state.phase


def world(
    chat: Sequence[model.NodeView],
    batch: Sequence[model.NodeView],
    rps: Mapping[PoolName, float],
    *,
    chat_strategy: Any = None,
    chat_paused: bool = False,
    others: Sequence[model.NodeView] = (),
) -> World:
    clock = ManualClock(T0)
    views = Views([*chat, *batch, *others])
    demand = Demand(dict(rps), clock)
    actuators = {
        CHAT: CodecActuator(views, CHAT_SPEC, clock, KEYS),
        BATCH: CodecActuator(views, BATCH_SPEC, clock, KEYS),
    }
    audit = MemoryAuditStore()
    seen = Seen()
    reconciler = Reconciler(
        [
            config(CHAT, {"pool": "chat"}, CHAT_POLICY, chat_strategy, chat_paused),
            config(BATCH, {"accelerator": "l20"}, BATCH_POLICY),
        ],
        observer=Observer(
            [
                config(CHAT, {"pool": "chat"}, CHAT_POLICY, chat_strategy, chat_paused),
                config(BATCH, {"accelerator": "l20"}, BATCH_POLICY),
            ],
            views=views,
            metrics=demand,
            keys=KEYS,
        ),
        clock=clock,
        actuators=actuators,
        audit_log=AuditLog(audit, sink=None, new_id=UlidFactory(clock)),
        leadership=AlwaysLeader(now=clock),
        keys=KEYS,
    )
    originals = {str(v.name): v for v in views.nodes}
    return World(reconciler, views, demand, clock, actuators, audit, seen, originals)


def check_every_record_names_its_nodes_pool(w: World, pools: Mapping[str, PoolName]) -> None:
    """An intent, outcome or refusal about a node is filed under the pool that node is in."""
    about_nodes = [r for r in w.audit.records if r.node]
    assert about_nodes
    for r in about_nodes:
        assert r.pool == pools[str(r.node)], (r.kind, r.node, r.pool)


# ---------------------------------------------------------------------------------------------


async def test_each_pool_lends_what_its_own_demand_and_policy_allow_with_its_own_lend_spec() -> (
    None
):
    # chat: 5 rps at 10 a node needs 1 of 4; batch: 60 rps at 50 a node needs 2 (and 2 at least).
    w = world(
        [chat_node(i) for i in range(4)],
        [batch_node(i) for i in range(4)],
        {CHAT: 5.0, BATCH: 60.0},
    )

    report = await w.tick()

    assert report.proposals[CHAT].lend_target == 3
    assert report.proposals[BATCH].lend_target == 2
    chat_lent = w.actuators[CHAT].of("lend")
    batch_lent = w.actuators[BATCH].of("lend")
    assert len(chat_lent) == 3
    assert set(chat_lent) <= set(CHAT_NODES)
    assert len(batch_lent) == 2
    assert set(batch_lent) <= set(BATCH_NODES)
    # Each node changed as its own pool's lend spec says, and no other way.
    for name in chat_lent:
        view = w.views.get(name)
        assert (view.labels["pool"], view.labels["workload"]) == ("lent", "training")
        assert view.taints == nodestate.lent_taints(w.originals[name].taints, CHAT_SPEC)
    for name in batch_lent:
        view = w.views.get(name)
        assert (view.labels["pool"], view.labels["workload"]) == ("batch", "batch")
        assert view.taints == nodestate.lent_taints(w.originals[name].taints, BATCH_SPEC)
    intents = w.records(Kind.INTENT)
    assert sorted(r.node or "" for r in intents if r.pool == CHAT) == sorted(chat_lent)
    assert sorted(r.node or "" for r in intents if r.pool == BATCH) == sorted(batch_lent)
    check_every_record_names_its_nodes_pool(w, POOL_OF)

    # A steady tick: chat's lent nodes no longer carry pool=chat, yet they are still chat's.
    again = await w.tick()
    assert not again.steps
    assert w.seen.lent[-1] == {"chat": 3, "batch": 2}


async def test_one_pool_lends_while_the_other_reclaims_within_its_own_deadline() -> None:
    # batch has three loans out and its demand now needs every node; chat's is low.
    w = world(
        [chat_node(i) for i in range(4)],
        [lent(batch_node(i), BATCH_SPEC) for i in range(3)] + [batch_node(3)],
        {CHAT: 5.0, BATCH: 200.0},
    )

    first = await w.tick()

    chat, batch = w.actuators[CHAT], w.actuators[BATCH]
    assert len(chat.of("lend")) == 3
    assert chat.of("reclaim") == []
    assert batch.of("lend") == []
    assert sorted(batch.of("reclaim")) == BATCH_NODES[:3]
    reclaims = [c for c in batch.calls if c.call == "reclaim"]
    # Counted from the tick's start with batch's 10 minutes, not chat's 2.
    assert {c.deadline for c in reclaims} == {T0 + BATCH_POLICY.reclaim_deadline}
    assert {c.outcome for c in reclaims} == {Outcome.IN_PROGRESS}  # the borrowed pods drain
    assert {a.intent.origin for a in first.steps if a.intent and a.intent.pool == BATCH} == {
        model.Origin.SAFETY.value
    }

    w.clock.advance(30)
    second = await w.tick()

    assert sorted(a.node for a in second.progressed) == BATCH_NODES[:3]
    assert all(a.result and a.result.outcome is Outcome.APPLIED for a in second.progressed)
    assert chat.of("progress") == []  # chat had nothing in flight
    for name in BATCH_NODES:
        assert w.phase(name) is nodestate.Phase.SERVING
        view, before = w.views.get(name), batch_node(int(name[-1]))
        assert (view.labels, view.taints) == (before.labels, before.taints), name
    # Each reclaim's drain was closed on batch's intent, and counted as batch's.
    reclaim_intents = {r.id for r in w.records(Kind.INTENT, BATCH) if r.action == "reclaim"}
    applied = [r for r in w.records(Kind.OUTCOME, BATCH) if r.outcome == Outcome.APPLIED.value]
    assert {r.intent_id for r in applied} >= reclaim_intents
    assert sorted(pool for pool, _, _ in w.seen.reclaims) == ["batch"] * 3
    check_every_record_names_its_nodes_pool(w, POOL_OF)


async def test_a_failing_strategy_in_one_pool_leaves_the_other_lending_and_its_own_safety() -> None:
    # chat's strategy raises; its demand (35 rps: 4 nodes) needs back the two it lent.
    w = world(
        [lent(chat_node(i), CHAT_SPEC) for i in range(2)] + [chat_node(2), chat_node(3)],
        [batch_node(i) for i in range(4)],
        {CHAT: 35.0, BATCH: 60.0},
        chat_strategy=Scripted(ZeroDivisionError("float division by zero")),
    )

    report = await w.tick()

    assert report.proposals[CHAT].reason.startswith("safety only: the strategy failed (raised")
    assert w.actuators[CHAT].of("lend") == []
    assert sorted(w.actuators[CHAT].of("reclaim")) == ["chat-0", "chat-1"]
    assert len(w.actuators[BATCH].of("lend")) == 2  # batch planned as usual
    [failed] = [r for r in w.records(Kind.FINDING) if r.reason == Reason.STRATEGY_FAILED]
    assert failed.pool == CHAT
    assert w.seen.strategy_failures == [("chat", "scripted", "raised")]
    assert w.seen.safety_only[-1] == {"chat": True, "batch": False}
    assert {r.origin for r in w.records(Kind.INTENT, BATCH)} == {model.Origin.STRATEGY.value}
    check_every_record_names_its_nodes_pool(w, POOL_OF)


async def test_a_paused_pool_lends_nothing_but_still_takes_back_what_demand_needs() -> None:
    w = world(
        [lent(chat_node(0), CHAT_SPEC), chat_node(1), chat_node(2), chat_node(3)],
        [batch_node(i) for i in range(4)],
        {CHAT: 40.0, BATCH: 60.0},
        chat_paused=True,
    )

    report = await w.tick()

    assert w.actuators[CHAT].of("lend") == []
    assert w.actuators[CHAT].of("reclaim") == ["chat-0"]  # 40 rps need all four
    assert len(w.actuators[BATCH].of("lend")) == 2
    assert not any(r.reason == Reason.PAUSED for r in report.plan.pools[BATCH].rejections)
    check_every_record_names_its_nodes_pool(w, POOL_OF)


async def test_a_node_both_pools_select_is_driven_by_the_first_pool_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="rebalancer.runtime.reconcile")
    # pool=chat and accelerator=l20: chat's selector and batch's both match it. chat's own
    # nodes run inference, so the shared node is the only one chat may lend.
    both = node("shared-0", {"pool": "chat", "accelerator": "l20"})
    busy = [dataclasses.replace(chat_node(i), pods=(inference_pod(f"llm-{i}"),)) for i in range(4)]
    w = world(busy, [batch_node(i) for i in range(4)], {CHAT: 5.0, BATCH: 60.0}, others=[both])

    report = await w.tick()
    await w.tick()

    members = {p: sorted(str(v.name) for v in s.nodes) for p, s in report.snapshot.pools.items()}
    assert members == {CHAT: [*CHAT_NODES, "shared-0"], BATCH: BATCH_NODES}
    assert w.actuators[CHAT].of("lend") == ["shared-0"]
    assert w.views.get("shared-0").labels["pool"] == "lent"  # chat's lend spec, not batch's
    assert all(c.node != "shared-0" for c in w.actuators[BATCH].calls)
    warned = [r for r in caplog.records if "selected by pools chat and batch" in r.getMessage()]
    assert len(warned) == 1  # once, not every tick
    check_every_record_names_its_nodes_pool(w, {**POOL_OF, "shared-0": CHAT})


def test_each_pool_judges_a_node_value_by_its_own_selector_and_a_new_value_anew() -> None:
    # Membership is judged once per node value and remembered on it: the answer must belong to
    # the selector that asked, and a relabelled node (a new value) must be judged again.
    chat = config(CHAT, {"pool": "chat"}, CHAT_POLICY)
    l20 = config(BATCH, {"accelerator": "l20"}, BATCH_POLICY)
    shared = node("shared-0", {"pool": "chat", "accelerator": "h100"})
    for _ in range(2):
        assert (chat.selects(shared, KEYS), l20.selects(shared, KEYS)) == (True, False)
    moved = dataclasses.replace(shared, labels={**shared.labels, "accelerator": "l20"})
    assert (chat.selects(moved, KEYS), l20.selects(moved, KEYS)) == (True, True)
    lent = lend(chat_node(0), EARLIER, CHAT_SPEC)  # its pool label now says "lent"
    assert lent.labels["pool"] == "lent"
    assert chat.selects(lent, KEYS)  # by the labels it has when it serves
    assert (chat.selects(shared, KEYS), l20.selects(shared, KEYS)) == (True, False)


@dataclass
class Crowded(CodecActuator):
    """A ``CodecActuator`` whose lends take a while, noting how many ran at once."""

    running: int = 0
    most: int = 0

    async def lend(self, node: str, decision: str) -> ActionResult:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            for _ in range(3):  # a few awaits, as a lend's API calls are
                await asyncio.sleep(0)
            return await super().lend(node, decision)
        finally:
            self.running -= 1


@pytest.mark.parametrize("limit", [1, 3])
async def test_a_wave_of_lends_goes_out_at_most_lend_concurrency_at_a_time(limit: int) -> None:
    # batch: 10 idle nodes and 50 rps at 50 a node, 2 always serving: 8 lends in one tick.
    w = world([chat_node(i) for i in range(4)], [batch_node(i) for i in range(10)], {BATCH: 50.0})
    crowded = Crowded(w.views, BATCH_SPEC, w.clock, KEYS)
    w.actuators[BATCH] = crowded  # the reconciler's own mapping
    w.reconciler.lend_concurrency = limit

    report = await w.tick()

    lends = [a for a in report.applied if a.call is Action.LEND]
    planned = [s.node for s in report.plan.pools[BATCH].steps if s.action is Action.LEND]
    assert [a.node for a in lends] == planned  # reported in the plan's order
    assert len(crowded.of("lend")) == 8
    assert crowded.most == limit
    assert sorted(n for n in crowded.of("lend") if w.phase(n) is nodestate.Phase.LENT) == sorted(
        planned
    )
    assert all(a.outcome is not None and a.outcome.outcome is Outcome.APPLIED for a in lends)
