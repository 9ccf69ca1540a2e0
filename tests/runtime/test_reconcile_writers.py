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
from tests.support import objects
from tests.support.pools import IDLE, POOL
from tests.support.reads import state_of
from tests.support.reconciling import CONFIG, HIGH, LOW, World, make_reconciler, world


def outcomes_of(w: World, intent: AuditRecord) -> list[AuditRecord]:
    return [r for r in w.records(Kind.OUTCOME) if r.intent_id == intent.id]


def bound_to(w: World, node: str) -> list[str]:
    return [p["metadata"]["name"] for p in w.store.peek(PODS) if p["spec"].get("nodeName") == node]


def removals(outcome: AuditRecord) -> list[tuple[str, str]]:
    """The pod writes of one outcome: (``evict`` or ``delete``, ``pod/namespace/name``)."""
    return [
        (w["kind"], w["target"])
        for w in outcome.detail.get("writes", ())
        if w["target"].startswith("pod/")
    ]


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
        # Its evicted pod, still bound to the name, ends its grace period: the drain waits.
        passed = outcomes_of(w, intent)
        assert [r.outcome for r in passed] == [Outcome.IN_PROGRESS, Outcome.IN_PROGRESS]
        assert "was replaced" in passed[-1].message
        assert "1 pod(s) of the loan left" in passed[-1].message
        w.advance(60)
        await w.tick()

        closed = outcomes_of(w, intent)
        assert [r.outcome for r in closed] == [Outcome.IN_PROGRESS] * 2 + [Outcome.GONE]
        assert "was replaced" in closed[-1].message
        assert state_of(w.store, node) == "serving"  # the new node is read as it is
        assert bound_to(w, node) == [f"gpu-exporter-{node}"]
        await w.tick()
        assert len(outcomes_of(w, intent)) == 3  # closed once, and left alone


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
        (evicted,) = outcomes_of(w, ended)
        assert evicted.outcome is Outcome.IN_PROGRESS
        assert "evicted pod(s) bound to an earlier node of this name: training/job-a-0" in (
            evicted.message
        )
        assert removals(evicted) == [("evict", "pod/training/job-a-0")]
        w.advance(60)  # its grace period
        await w.tick()
        closed = outcomes_of(w, ended)[-1]
        assert closed.outcome is Outcome.GONE
        assert bound_to(w, node) == [f"gpu-exporter-{node}"]  # the new node's DaemonSet pod stays
        await w.tick()  # ended once (the new node, idle at low demand, may be lent anew)
        assert [r for r in w.records(Kind.INTENT) if r.origin == "recovery"] == [ended]


def recreate(w: World, node: str) -> str:
    """The node registered again under its name, as a kubelet does after a reboot; its UID."""
    made = cluster.add(w.store, cluster.node(node, cluster.INFERENCE))
    return str(made["metadata"]["uid"])


async def until_gone(w: World, node: str, pod: str, step: float = 30.0) -> None:
    """Ticks, the clock moving ``step`` seconds before each, until ``pod`` is no longer bound
    to ``node`` (at most ten minutes)."""
    for _ in range(20):
        if pod not in bound_to(w, node):
            return
        w.advance(step)
        await w.tick()
    raise AssertionError(f"{pod} still bound to {node}: {bound_to(w, node)}")


def pod_removals(w: World, node: str) -> list[tuple[str, str]]:
    """Every pod write the outcomes of ``node``'s records name, in order."""
    return [x for r in w.records(Kind.OUTCOME) if r.node == node for x in removals(r)]


# A lent node is deleted, a tick sees it gone, and a node registers under its name ``delay``
# seconds later (0: within the tick). The ticks come every 3 s meanwhile, as the sandbox's do.
@pytest.mark.parametrize("delay", [0, 2, 6, 60])
async def test_a_lent_node_re_registered_after_any_delay_has_its_borrowed_pod_evicted(
    delay: int,
) -> None:
    async with world() as w:
        node = await lent_with(w, cluster.training_pod("job-a", 0, gpus=8, priority_class=None))
        await w.tick()
        w.advance(5)
        w.store.delete(NODES, None, node, DeleteOptions())
        if delay:
            await w.tick()
            for _ in range(delay // 3):
                w.advance(3)
                await w.tick()
            w.advance(delay % 3)
        new_uid = recreate(w, node)
        await w.tick()
        await until_gone(w, node, "job-a-0")

        (ended,) = [r for r in w.records(Kind.INTENT) if r.node == node and r.origin == "recovery"]
        assert "its loan ends, and the pods bound to it are removed" in ended.message
        said = outcomes_of(w, ended)
        assert said[-1].outcome is Outcome.GONE
        # The loan's record says what became of its pod: evicted, through the Eviction API.
        assert pod_removals(w, node) == [("evict", "pod/training/job-a-0")]
        assert "evicted pod(s) bound to an earlier node of this name: training/job-a-0" in (
            said[0].message
        )
        assert w.store.get(NODES, None, node)["metadata"]["uid"] == new_uid
        # The earlier node's DaemonSet pod is no loan's: left to the pod garbage collector.
        assert bound_to(w, node) == [f"gpu-exporter-{node}"]
        assert state_of(w.store, node) in ("serving", "lent")  # it may be lent anew
        w.advance(30)
        await w.tick()  # ended once, and left alone
        assert [r for r in w.records(Kind.INTENT) if r.origin == "recovery"] == [ended]


async def test_a_borrowed_pod_left_on_a_name_is_evicted_then_deleted_past_the_deadline() -> None:
    # A restart between the deletion and the new node: the new process never saw the loan end,
    # and finds the pod by its bind time. A budget that allows no disruption keeps it past the
    # deadline, when it is deleted as any reclaim's pod is.
    async with world() as w:
        node = await lent_with(w, cluster.training_pod("job-a", 0, gpus=8, priority_class=None))
        await w.tick()
        objects.budget(w.store, "job-a", min_available=1)
        w.advance(5)
        w.store.delete(NODES, None, node, DeleteOptions())
        w.advance(60)
        recreate(w, node)
        w.reconciler = make_reconciler(w.box, w.writer, w.informer, w.metrics, w.lead, w.audit)
        await w.reconciler.start()
        await w.tick()

        (found,) = [r for r in w.records(Kind.INTENT) if r.node == node and r.origin == "recovery"]
        assert found.detail["earlier_pods"] == ["training/job-a-0"]
        assert "runs borrowed pod(s) bound to its name before it was created" in found.message
        (first,) = outcomes_of(w, found)
        assert first.outcome is Outcome.IN_PROGRESS
        assert "1 blocked by a budget" in first.message
        assert [w["outcome"] for w in first.detail["writes"]] == ["blocked"]
        await until_gone(w, node, "job-a-0")
        said = outcomes_of(w, found)
        assert said[-1].outcome is Outcome.APPLIED
        assert pod_removals(w, node)[-1] == ("delete", "pod/training/job-a-0")
        assert said[-1].time - found.time >= CONFIG.policy.reclaim_deadline


@pytest.mark.parametrize("seen_gone", [True, False], ids=["seen gone", "never seen gone"])
async def test_a_restart_between_deletion_and_re_registration_still_removes_the_pod(
    seen_gone: bool,
) -> None:
    async with world() as w:
        node = await lent_with(w, cluster.training_pod("job-a", 0, gpus=8, priority_class=None))
        await w.tick()
        w.advance(5)
        w.store.delete(NODES, None, node, DeleteOptions())
        if seen_gone:  # the loan's end begun: the pod evicted while its node is away
            await w.tick()
        w.reconciler = make_reconciler(w.box, w.writer, w.informer, w.metrics, w.lead, w.audit)
        w.advance(6)
        await w.caught_up()
        await w.reconciler.start()
        recreate(w, node)
        await w.tick()
        await until_gone(w, node, "job-a-0")

        assert [x[1] for x in pod_removals(w, node)] == ["pod/training/job-a-0"]
        intents = [r for r in w.records(Kind.INTENT) if r.node == node and r.origin == "recovery"]
        for intent in intents:  # each closed
            assert outcomes_of(w, intent)[-1].outcome in (
                Outcome.GONE,
                Outcome.APPLIED,
                Outcome.INTERRUPTED,
            )
        assert bound_to(w, node) == [f"gpu-exporter-{node}"]
