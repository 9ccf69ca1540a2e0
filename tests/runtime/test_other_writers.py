"""The Reconciler when it is not the only writer on its nodes: what another writer did to a node
is noticed, reported (an audit finding, a Warning Event with a reason of its own, a metric) and
acted on toward inference; a node whose state cannot be read, or that no pool selects now, is
still the controller's to finish (docs/design/other-writers.md).

Two pools as in ``test_multi_pool``: ``chat`` selects ``pool=chat`` and its lend relabels the node
``pool=lent`` (so its specification names ``pool=chat`` as a serving label, which is what a
restore from the specification writes back), ``batch`` selects ``accelerator=l20``. The nodes are
fakes moved through the node-state codec by ``CodecActuator``; the audit store is the in-memory
one, the Events the very ``adapters.events`` values the recorder would create.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from rebalancer.adapters import events, registry
from rebalancer.adapters.audit import AuditLog, MemoryAuditStore, UlidFactory
from rebalancer.core import model, nodestate
from rebalancer.core.audit import Kind
from rebalancer.core.model import Action, PodMarks, PoolName, Reason
from rebalancer.core.outcomes import ActionResult
from rebalancer.core.policy import PoolPolicy
from rebalancer.runtime import telemetry
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.report import TickReport
from rebalancer.runtime.seams import AlwaysLeader, PoolConfig
from sandbox.emulator.clock import ManualClock
from tests.support.factories import (
    INFERENCE_TAINT,
    KEYS,
    T0,
    lend,
    other_pod,
    rebuilt,
    serving,
)
from tests.support.fakes import CodecActuator, Demand, Views

CHAT, BATCH = PoolName("chat"), PoolName("batch")
CHAT_SPEC = nodestate.LendSpec(
    remove_taints=(INFERENCE_TAINT,),
    add_taints=(model.Taint(key=KEYS.lent_taint, value="training", effect="NoSchedule"),),
    labels={"pool": "lent", "workload": "training"},
    serving_labels={"pool": "chat"},
)
BATCH_SPEC = nodestate.LendSpec(
    remove_taints=(INFERENCE_TAINT,),
    add_taints=(model.Taint(key=KEYS.lent_taint, value="batch", effect="NoSchedule"),),
    labels={"workload": "batch"},
)


def policy(rps_per_node: float, spec: nodestate.LendSpec) -> PoolPolicy:
    """A pool that lends and takes back at once: no headroom, cooldown or warm-up."""
    return PoolPolicy(
        rps_per_node=rps_per_node,
        min_serving=1,
        lend_spec=spec,
        headroom=0.0,
        cooldown=timedelta(0),
        max_step_fraction=1.0,
        warmup=timedelta(0),
    )


POLICIES = {CHAT: policy(10.0, CHAT_SPEC), BATCH: policy(50.0, BATCH_SPEC)}
SELECTORS = {CHAT: {"pool": "chat"}, BATCH: {"accelerator": "l20"}}
EARLIER = T0 - timedelta(hours=1)


def chat_node(i: int) -> model.NodeView:
    view = serving(f"chat-{i}")
    return dataclasses.replace(view, labels={**view.labels, "pool": "chat"})


def batch_node(i: int) -> model.NodeView:
    view = serving(f"batch-{i}")
    return dataclasses.replace(view, labels={**view.labels, "pool": "batch", "accelerator": "l20"})


def lent(view: model.NodeView, spec: nodestate.LendSpec) -> model.NodeView:
    """Lent an hour ago; no training pod runs on it (a reclaim ends in the same call)."""
    return lend(view, EARLIER, spec, pods=())


@dataclass
class Recorded:
    """An ``EventRecorder`` that keeps the Events ``adapters.events`` makes of each plan's
    findings (the same pure function the Kubernetes recorder uses)."""

    found: list[events.NodeEvent] = field(default_factory=list)

    async def action(self, result: ActionResult, decision: str | None = None) -> None:
        pass

    async def findings(self, plan: model.Plan) -> None:
        self.found += [events.finding_event(f) for f in plan.findings]

    def reasons(self, node: str) -> set[str]:
        return {e.reason for e in self.found if e.node == node}


@dataclass
class World:
    reconciler: Reconciler
    views: Views
    actuators: dict[PoolName, CodecActuator]
    audit: MemoryAuditStore
    recorded: Recorded
    metrics: telemetry.Telemetry

    async def tick(self) -> TickReport:
        report = await self.reconciler.tick()
        self.metrics.record(report)
        return report

    def records(self, kind: Kind, node: str | None = None) -> list[model.Reason | str]:
        return [
            r.reason
            for r in self.audit.records
            if r.kind is kind and (node is None or r.node == node)
        ]

    def drift(self, pool: str, kind: Reason) -> float | None:
        return self.metrics.registry.get_sample_value(
            "rebalancer_node_drift", {"pool": pool, "kind": kind.value}
        )


def world(nodes: Sequence[model.NodeView], rps: Mapping[PoolName, float]) -> World:
    clock = ManualClock(T0)
    views = Views(list(nodes))
    actuators = {
        CHAT: CodecActuator(views, CHAT_SPEC, clock, KEYS),
        BATCH: CodecActuator(views, BATCH_SPEC, clock, KEYS),
    }
    audit = MemoryAuditStore()
    recorded = Recorded()
    metrics = telemetry.Telemetry()
    configs = [
        PoolConfig(
            name=name,
            node_selector=SELECTORS[name],
            policy=POLICIES[name],
            marks=PodMarks(POLICIES[name].lend_spec.add_taints, (INFERENCE_TAINT,)),
            strategy=registry.build("reactive"),
            strategy_name="reactive",
        )
        for name in (CHAT, BATCH)
    ]
    reconciler = Reconciler(
        configs,
        observer=Observer(configs, views=views, metrics=Demand(dict(rps), clock), keys=KEYS),
        clock=clock,
        actuators=actuators,
        audit_log=AuditLog(audit, sink=None, new_id=UlidFactory(clock)),
        leadership=AlwaysLeader(now=clock),
        keys=KEYS,
        events=recorded,
    )
    return World(reconciler, views, actuators, audit, recorded, metrics)


def without(view: model.NodeView, label: str) -> model.NodeView:
    labels = {k: v for k, v in view.labels.items() if k != label}
    return rebuilt(dataclasses.replace(view, labels=labels))


def annotated(view: model.NodeView, **values: str) -> model.NodeView:
    return rebuilt(view, annotations={**view.annotations, **values})


def ours(view: model.NodeView) -> set[str]:
    """The keys of ours still on the node besides ``since`` and ``decision`` (which stay)."""
    keys = {*view.labels, *view.annotations} - {KEYS.since, KEYS.decision}
    return {k for k in keys if k.startswith(KEYS.prefix)} | {
        t.key for t in view.taints if t.key.startswith(KEYS.prefix)
    }


# ---------------------------------------------------------------------------------------------


async def test_a_lent_node_whose_state_label_was_removed_is_taken_back_from_its_own_original() -> (
    None
):
    # chat: 5 rps needs 1 of 4 nodes, so the strategy would lend more; the node whose state
    # label another writer removed must not read as serving, nor be lent "again".
    before = chat_node(0)
    stripped = without(lent(before, CHAT_SPEC), KEYS.state)
    w = world([stripped, *(chat_node(i) for i in range(1, 4))], {CHAT: 5.0, BATCH: 0.0})

    report = await w.tick()

    assert [(s.node, s.action, s.reason) for s in report.plan.pools[CHAT].steps] == [
        ("chat-0", Action.RECLAIM, Reason.STATE_LABEL_LOST)
    ]
    assert w.actuators[CHAT].of("lend") == []  # nothing is lent while a node is taken back
    back = w.views.get("chat-0")
    assert (back.taints, dict(back.labels)) == (before.taints, dict(before.labels))
    assert ours(back) == set()
    assert Reason.STATE_LABEL_LOST in w.records(Kind.FINDING, "chat-0")
    assert w.recorded.reasons("chat-0") == {"StateLabelLost"}
    assert w.drift("chat", Reason.STATE_LABEL_LOST) == 1

    # Back and serving like any other node: the next tick may lend again, and it is clean.
    await w.tick()
    assert w.actuators[CHAT].of("lend")
    assert w.drift("chat", Reason.STATE_LABEL_LOST) == 0


async def test_a_serving_node_with_a_lent_taint_counts_as_lent_in_the_plan_and_the_gauge() -> None:
    # Another writer wiped our labels and annotations from a lent node and left the lent
    # taint: it reads as serving, and only the pool's lent taints tell its original is lost.
    wiped = chat_node(0)
    marked = rebuilt(dataclasses.replace(wiped, taints=(*wiped.taints, *CHAT_SPEC.add_taints)))
    w = world([marked, *(chat_node(i) for i in range(1, 4))], {CHAT: 5.0, BATCH: 0.0})

    report = await w.tick()

    assert "1 lent (1 of them unreadable)" in report.plan.pools[CHAT].summary
    gauge = w.metrics.registry.get_sample_value("rebalancer_nodes_lent", {"pool": "chat"})
    assert gauge == 1, "the gauge counts what the planner counts"


async def test_lent_nodes_with_unreadable_originals_are_away_and_come_back_by_the_spec() -> None:
    garbled = annotated(lent(chat_node(0), CHAT_SPEC), **{KEYS.original: "{garbled"})
    gone = lent(chat_node(1), CHAT_SPEC)
    gone = rebuilt(
        gone, annotations={k: v for k, v in gone.annotations.items() if k != KEYS.original}
    )
    w = world([garbled, gone, chat_node(2), chat_node(3)], {CHAT: 5.0, BATCH: 0.0})

    report = await w.tick()

    chat = report.plan.pools[CHAT]
    assert sorted((s.node, s.reason) for s in chat.steps) == [
        ("chat-0", Reason.STATE_UNREADABLE),
        ("chat-1", Reason.STATE_UNREADABLE),
    ]
    assert w.actuators[CHAT].of("lend") == []
    assert "2 lent (2 of them unreadable)" in chat.summary
    for name in ("chat-0", "chat-1"):
        back = w.views.get(name)
        # The pool's serving taint back, its lent taint gone, its serving label set, the lent
        # one removed; every other taint and label as the node had it.
        assert back.taints == (
            *(t for t in chat_node(0).taints if t != INFERENCE_TAINT),
            INFERENCE_TAINT,
        )
        assert back.labels["pool"] == "chat"
        assert "workload" not in back.labels
        assert ours(back) == set()
        # Its lend relabelled it pool=lent: unreadable, its labels are all there is, and no
        # pool selects it by them; chat adopts it, as it carries chat's lent taint.
        assert w.recorded.reasons(name) == {"StateUnreadable", "NodeOrphaned"}
    # The unreadable text is kept in the audit log.
    finding = next(r for r in w.audit.records if r.kind is Kind.FINDING and r.node == "chat-0")
    assert finding.detail == {"key": KEYS.original, "value": "{garbled"}
    assert w.drift("chat", Reason.STATE_UNREADABLE) == 2


async def test_a_lent_node_that_lost_its_lent_taint_or_took_a_foreign_pod_is_taken_back() -> None:
    no_taint = lent(chat_node(0), CHAT_SPEC)
    no_taint = rebuilt(
        dataclasses.replace(
            no_taint, taints=tuple(t for t in no_taint.taints if t.key != KEYS.lent_taint)
        )
    )
    foreign = lent(chat_node(1), CHAT_SPEC)
    foreign = rebuilt(foreign, pods=(*foreign.pods, other_pod("web-1")))
    w = world([no_taint, foreign, chat_node(2), chat_node(3)], {CHAT: 5.0, BATCH: 0.0})

    report = await w.tick()

    assert sorted((s.node, s.reason) for s in report.plan.pools[CHAT].steps) == [
        ("chat-0", Reason.LENT_TAINT_LOST),
        ("chat-1", Reason.FOREIGN_POD),
    ]
    assert w.recorded.reasons("chat-0") == {"LentTaintLost"}
    assert w.recorded.reasons("chat-1") == {"ForeignPodOnLentNode"}
    foreign_finding = next(
        r for r in w.audit.records if r.kind is Kind.FINDING and r.node == "chat-1"
    )
    assert foreign_finding.detail == {"key": "pod", "value": "ns/web-1"}
    assert w.drift("chat", Reason.LENT_TAINT_LOST) == 1
    assert w.drift("chat", Reason.FOREIGN_POD) == 1
    for name in ("chat-0", "chat-1"):
        state = nodestate.read(w.views.get(name), KEYS)
        assert isinstance(state, nodestate.NodeState)
        assert (state.phase, state.drift) == (nodestate.Phase.SERVING, ())


async def test_a_lent_node_no_pool_selects_is_adopted_and_taken_back_from_its_own_original() -> (
    None
):
    # GPU Feature Discovery rewrote the label batch selects on while the node was lent.
    before = batch_node(0)
    moved = lent(before, BATCH_SPEC)
    moved = rebuilt(
        dataclasses.replace(moved, labels={**moved.labels, "accelerator": "l20-shared"})
    )
    w = world([moved, batch_node(1), chat_node(0), chat_node(1)], {CHAT: 0.0, BATCH: 0.0})

    report = await w.tick()

    # batch adopts it: it carries batch's lent taint. Restored from its own original, the
    # relabel GPU Feature Discovery made stays.
    assert [(s.node, s.reason) for s in report.plan.pools[BATCH].steps] == [
        ("batch-0", Reason.ORPHANED)
    ]
    back = w.views.get("batch-0")
    assert back.taints == before.taints
    assert dict(back.labels) == {**before.labels, "accelerator": "l20-shared"}
    assert ours(back) == set()
    assert w.recorded.reasons("batch-0") == {"NodeOrphaned"}
    assert w.records(Kind.INTENT, "batch-0") == ["orphaned"]

    # Finished: no pool's node, nothing more about it.
    again = await w.tick()
    assert all(v.name != "batch-0" for p in again.snapshot.pools.values() for v in p.nodes)


async def test_a_node_two_pools_select_is_a_finding_and_an_event_once_per_pair_of_pools() -> None:
    both = dataclasses.replace(chat_node(0), labels={**chat_node(0).labels, "accelerator": "l20"})
    w = world([both, chat_node(1), batch_node(0), batch_node(1)], {CHAT: 100.0, BATCH: 500.0})

    await w.tick()
    await w.tick()

    assert w.records(Kind.FINDING, "chat-0") == ["selected_by_many_pools"]  # once, not per tick
    (event,) = {e for e in w.recorded.found if e.node == "chat-0"}
    assert (event.type, event.reason) == ("Warning", "SelectedByManyPools")
    assert event.note == "selected by pools chat and batch: only chat drives it; fix the selectors"
    assert w.drift("chat", Reason.SELECTED_BY_MANY_POOLS) == 1
