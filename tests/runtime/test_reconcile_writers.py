"""The reconcile step when others write the nodes it drains: a node deleted and created again
under its name mid-reclaim, a pod a finalizer holds. Against the API emulator over HTTP, with the
real informer and actuator (the world of ``test_reconcile``)."""

from __future__ import annotations

import pytest

from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.outcomes import Outcome
from sandbox.emulator import cluster
from sandbox.emulator.resources import NODES, PODS
from sandbox.emulator.store import DeleteOptions
from tests.support.pools import IDLE, POOL
from tests.support.reads import state_of
from tests.support.reconciling import HIGH, LOW, World, world


def outcomes_of(w: World, intent: AuditRecord) -> list[AuditRecord]:
    return [r for r in w.records(Kind.OUTCOME) if r.intent_id == intent.id]


def reclaim_intent(w: World, node: str) -> AuditRecord:
    (intent,) = [r for r in w.records(Kind.INTENT) if r.node == node and r.action == "reclaim"]
    return intent


async def lent_with(w: World, pod: dict[str, object]) -> str:
    """Every idle node lent, ``pod`` bound to the first; that node's name."""
    await w.reconciler.start()
    w.metrics.rps[POOL] = LOW
    await w.tick()
    node = IDLE[0]
    assert state_of(w.store, node) == "lent"
    spec = pod["spec"]
    assert isinstance(spec, dict)
    spec["nodeName"] = node
    cluster.add(w.store, pod)
    return node


async def test_a_reclaiming_node_deleted_and_created_again_closes_its_reclaim_as_gone() -> None:
    async with world() as w:
        node = await lent_with(w, cluster.training_pod("job-a", 0, gpus=1, priority_class=None))
        w.metrics.rps[POOL] = HIGH
        await w.tick()
        assert state_of(w.store, node) == "reclaiming"  # the pod terminates for 60 s
        intent = reclaim_intent(w, node)
        assert intent.detail["node_uid"] == w.store.get(NODES, None, node)["metadata"]["uid"]
        assert [r.outcome for r in outcomes_of(w, intent)] == [Outcome.IN_PROGRESS]

        w.store.delete(NODES, None, node, DeleteOptions())
        cluster.add(w.store, cluster.node(node, cluster.INFERENCE))
        w.advance(1)
        await w.tick()

        closed = outcomes_of(w, intent)
        assert [r.outcome for r in closed] == [Outcome.IN_PROGRESS, Outcome.GONE]
        assert "was replaced" in closed[-1].message
        assert state_of(w.store, node) == "serving"  # the new node is read as it is
        await w.tick()
        assert len(outcomes_of(w, intent)) == 2  # closed once, and left alone


async def test_a_drain_a_finalizer_holds_is_recorded_when_what_it_says_changes_not_every_tick() -> (
    None
):
    async with world() as w:
        pod = cluster.training_pod("job-a", 0, gpus=1, priority_class=None)
        pod["metadata"]["finalizers"] = ["example.com/checkpoint"]
        node = await lent_with(w, pod)
        w.metrics.rps[POOL] = HIGH
        await w.tick()
        intent = reclaim_intent(w, node)
        for _ in range(12):  # six minutes of ticks: the 60 s deadline is long past
            w.advance(30)
            await w.tick()
        assert state_of(w.store, node) == "reclaiming"  # counted away: safe for inference
        said = [(r.outcome, r.message) for r in outcomes_of(w, intent)]
        held = "held past the deadline by finalizers: training/job-a-0 (example.com/checkpoint)"
        assert len(said) <= 4, said  # not one a tick
        assert said[-1][0] is Outcome.IN_PROGRESS
        assert held in said[-1][1]
        assert outcomes_of(w, intent)[-1].detail["held_by_finalizers"] == [
            "training/job-a-0 (example.com/checkpoint)"
        ]
        assert len({message for _, message in said}) == len(said)  # each says something new


@pytest.mark.parametrize(
    "seen_lent",
    [
        pytest.param(True, id="a loan a tick has seen"),
        # lent, a pod bound and the node replaced within one second, before a tick sees it lent
        pytest.param(False, id="a loan replaced within the second it was lent"),
    ],
)
async def test_a_lent_node_deleted_and_created_again_ends_its_loan_and_removes_the_old_pods(
    seen_lent: bool,
) -> None:
    async with world() as w:
        pod = cluster.training_pod("job-a", 0, gpus=1, priority_class=None)
        node = await lent_with(w, pod)
        if seen_lent:
            await w.tick()
            w.advance(5)
        lent_uid = w.store.get(NODES, None, node)["metadata"]["uid"]
        w.store.delete(NODES, None, node, DeleteOptions())
        cluster.add(w.store, cluster.node(node, cluster.INFERENCE))
        await w.tick()

        (ended,) = [r for r in w.records(Kind.INTENT) if r.node == node and r.origin == "recovery"]
        assert ended.action == "reclaim"
        assert ended.detail["node_uid"] == lent_uid
        assert "has been deleted: its loan ends" in ended.message
        (closed,) = outcomes_of(w, ended)
        assert closed.outcome is Outcome.GONE
        assert "deleted pod(s) bound to an earlier node of this name: training/job-a-0" in (
            closed.message
        )
        bound = [
            p["metadata"]["name"] for p in w.store.peek(PODS) if p["spec"].get("nodeName") == node
        ]
        assert bound == [f"gpu-exporter-{node}"]  # the new node's DaemonSet pod stays
        await w.tick()  # ended once (the new node, idle at low demand, may be lent anew)
        assert [r for r in w.records(Kind.INTENT) if r.origin == "recovery"] == [ended]
