"""The actuator among other writers, on the emulator and on a real kube-apiserver.

The controller is not the only writer on its nodes: a GPU health checker taints a broken GPU,
the node lifecycle taints an unreachable node, an operator cordons one, someone removes the
lent taint, a node is deleted and created again under its name, a finalizer holds a pod. Each
test plays one of them against a node the real ``Actuator`` lent, and checks that the restore
keeps what they did, the drain takes every pod of the loan and nothing else, and a node is
known by its UID.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timedelta
from typing import Any

import pytest

from rebalancer.adapters import convert
from rebalancer.core.outcomes import Outcome, WriteKind
from sandbox.emulator import cluster
from sandbox.emulator.resources import NODES, PODS
from sandbox.emulator.store import DeleteOptions
from tests.support import objects
from tests.support.actuation import KEYS, Crash, drive, restart_passes, world
from tests.support.backends import Backend, Objects
from tests.support.objects import TAINTS, training
from tests.support.reads import node_obj, pods_on, scheduling_of

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
UNHEALTHY = {"key": "nvidia.com/gpu.unhealthy", "value": "true", "effect": "NoSchedule"}
UNREACHABLE = {
    "key": "node.kubernetes.io/unreachable",
    "effect": "NoExecute",
    "timeAdded": "2026-03-02T13:00:00Z",
}
CORDON = {
    "key": "node.kubernetes.io/unschedulable",
    "effect": "NoSchedule",
    "timeAdded": "2026-03-02T13:05:00Z",
}


def set_taints(store: Objects, node: str, taints: list[Obj], **spec: Any) -> None:
    """Another writer sets the node's taints (a merge patch replaces the list whole)."""
    body = json.dumps({"spec": {"taints": taints, **spec}}).encode()
    store.patch(NODES, None, node, MERGE, body)


def taints_of(store: Objects, node: str) -> list[Obj]:
    taints: list[Obj] = node_obj(store, node)["spec"].get("taints") or []
    return taints


async def test_a_taint_added_to_a_lent_node_by_another_writer_survives_the_reclaim(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        act = w.actuator(w.writer())
        await act.lend("gpu-0", "audit-1")
        lent = taints_of(w.objects, "gpu-0")
        set_taints(w.objects, "gpu-0", [UNHEALTHY, *lent, UNREACHABLE])
        back = await act.reclaim("gpu-0", "audit-2", w.now() + timedelta(minutes=5))
        assert back.outcome is Outcome.APPLIED
        assert taints_of(w.objects, "gpu-0") == [UNHEALTHY, *TAINTS, UNREACHABLE]
        assert back.kept == (
            "nvidia.com/gpu.unhealthy=true:NoSchedule",
            "node.kubernetes.io/unreachable:NoExecute",
        )
        assert back.message == (
            "reclaimed: serving again; kept taints other writers own: "
            "nvidia.com/gpu.unhealthy=true:NoSchedule, node.kubernetes.io/unreachable:NoExecute"
        )
        begin = next(x for x in back.writes if x.kind is WriteKind.BEGIN_RECLAIM)
        assert begin.body["spec"]["taints"] == [UNHEALTHY, *TAINTS, UNREACHABLE]


async def test_a_cordon_made_while_the_node_was_lent_survives_the_reclaim(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        act = w.actuator(w.writer())
        await act.lend("gpu-0", "audit-1")
        set_taints(w.objects, "gpu-0", [*taints_of(w.objects, "gpu-0"), CORDON], unschedulable=True)
        back = await act.reclaim("gpu-0", "audit-2", w.now() + timedelta(minutes=5))
        assert back.outcome is Outcome.APPLIED
        node = node_obj(w.objects, "gpu-0")
        assert node["spec"]["taints"] == [*TAINTS, CORDON]
        assert node["spec"]["unschedulable"] is True
        assert back.kept == ("node.kubernetes.io/unschedulable:NoSchedule",)


async def test_a_taint_added_to_a_lending_node_survives_the_rollback(backend: Backend) -> None:
    async with world("gpu-0", backend=backend) as w:
        labels, _ = scheduling_of(w.objects, "gpu-0")
        with contextlib.suppress(Crash):
            await w.actuator(w.writer(crash_after=1)).lend("gpu-0", "audit-1")  # left lending
        set_taints(w.objects, "gpu-0", [*TAINTS, UNHEALTHY])
        restarted = w.writer()
        (rolled_back,) = await restart_passes(w.actuator(restarted), restarted)
        assert rolled_back.outcome is Outcome.APPLIED
        assert taints_of(w.objects, "gpu-0") == [*TAINTS, UNHEALTHY]
        assert scheduling_of(w.objects, "gpu-0")[0] == labels
        assert rolled_back.kept == ("nvidia.com/gpu.unhealthy=true:NoSchedule",)


async def test_nobody_elses_write_means_the_restore_is_byte_for_byte_and_names_nothing_kept(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        before = scheduling_of(w.objects, "gpu-0")
        act = w.actuator(w.writer())
        await act.lend("gpu-0", "audit-1")
        back = await act.reclaim("gpu-0", "audit-2", w.now() + timedelta(minutes=5))
        assert scheduling_of(w.objects, "gpu-0") == before
        assert (back.kept, back.message) == ((), "reclaimed: serving again")


async def test_a_pod_that_landed_because_the_lent_taint_was_removed_is_evicted_by_the_reclaim(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        rec = w.writer()
        act = w.actuator(rec)
        await act.lend("gpu-0", "audit-1")
        no_lent = [t for t in taints_of(w.objects, "gpu-0") if t["key"] != KEYS.lent_taint]
        set_taints(w.objects, "gpu-0", no_lent)
        # No toleration at all: the scheduler put it there once the lent taint was gone.
        objects.add(w.objects, objects.bound(objects.pod("stray", "training"), "gpu-0"))
        borrowed = training(w.objects, "job-a", 1, "gpu-0")
        result = await act.reclaim("gpu-0", "audit-2", w.now() + timedelta(minutes=5))
        assert result.outcome is Outcome.IN_PROGRESS
        assert rec.pod_targets == {"training/stray", *(f"training/{n}" for n in borrowed)}
        done = await drive(act, "gpu-0", result, w)
        assert done.outcome is Outcome.APPLIED
        assert set(pods_on(w.objects, "gpu-0")) == {"kube-system/gpu-exporter-gpu-0"}


async def test_a_drain_never_touches_inference_or_daemonset_pods_whatever_landed(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        rec = w.writer()
        act = w.actuator(rec)
        await act.lend("gpu-0", "audit-1")
        objects.add(w.objects, cluster.inference_pod(7, node_name="gpu-0"))
        objects.add(w.objects, objects.bound(objects.pod("stray", "training"), "gpu-0"))
        w.advance(600)
        result = await act.reclaim("gpu-0", "audit-2", w.now())  # past the deadline: deletes
        done = await drive(act, "gpu-0", result, w)
        assert done.outcome is Outcome.APPLIED
        assert rec.pod_targets == {"training/stray"}
        assert set(pods_on(w.objects, "gpu-0")) == {
            "kube-system/gpu-exporter-gpu-0",
            "inference/llm-serving-7d9f8c6b5-00007",
        }


def recreate(store: Objects, name: str) -> str:
    """Delete the Node and create it again under its name (no keys of ours); its new UID."""
    store.delete(NODES, None, name, DeleteOptions())
    made = objects.add(store, objects.gpu_node(name))
    return str(made["metadata"]["uid"])


async def test_a_reclaim_of_a_node_that_was_replaced_ends_gone_without_a_write(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        setup = w.actuator(w.writer())
        await setup.lend("gpu-0", "audit-1")
        old = str(node_obj(w.objects, "gpu-0")["metadata"]["uid"])
        new = recreate(w.objects, "gpu-0")
        assert new != old
        rec = w.writer()
        act = w.actuator(rec)
        result = await act.reclaim("gpu-0", "audit-2", w.now(), uid=old)
        assert result.outcome is Outcome.GONE
        assert f"uid {old}" in result.message
        assert f"uid {new}" in result.message
        passed = await act.progress("gpu-0", uid=old)
        assert passed.outcome is Outcome.GONE
        assert rec.writes == []
        # The same calls for the node that is there now do what they always did.
        assert (await act.reclaim("gpu-0", "audit-3", w.now(), uid=new)).outcome is Outcome.NOTHING


async def test_a_pod_bound_to_an_earlier_node_of_the_name_is_deleted_at_once_on_reclaim(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        await w.actuator(w.writer()).lend("gpu-0", "audit-1")
        (old_pod,) = training(w.objects, "job-old", 1, "gpu-0")
        # Bound by the scheduler long before the node that now has the name was created.
        scheduled = {
            "type": "PodScheduled",
            "status": "True",
            "lastTransitionTime": "2020-01-01T00:00:00Z",
        }
        body = json.dumps({"status": {"conditions": [scheduled]}}).encode()
        w.objects.patch(PODS, "training", old_pod, MERGE, body, subresource="status")
        w.advance(60)
        recreate(w.objects, "gpu-0")
        rec = w.writer()
        act = w.actuator(rec)
        lent = await act.lend("gpu-0", "audit-2")  # a borrowed pod does not make it busy
        assert lent.outcome is Outcome.APPLIED
        fresh = training(w.objects, "job-new", 1, "gpu-0")
        result = await act.reclaim("gpu-0", "audit-3", w.now() + timedelta(minutes=5))
        kinds = {x.target: x.kind for x in result.writes if x.target.startswith("pod/")}
        assert kinds == {
            f"pod/training/{old_pod}": WriteKind.DELETE,  # at once, as the pod GC would
            f"pod/training/{fresh[0]}": WriteKind.EVICT,  # through its budget, as any other
        }
        assert f"bound to an earlier node of this name: training/{old_pod}" in result.message
        done = await drive(act, "gpu-0", result, w)
        assert done.outcome is Outcome.APPLIED
        assert set(pods_on(w.objects, "gpu-0")) == {"kube-system/gpu-exporter-gpu-0"}


def bound_at(store: Objects, pod: str, when: datetime) -> None:
    """The pod's PodScheduled condition says it was bound at ``when`` (whole seconds)."""
    scheduled = {
        "type": "PodScheduled",
        "status": "True",
        "lastTransitionTime": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    body = json.dumps({"status": {"conditions": [scheduled]}}).encode()
    store.patch(PODS, cluster.TRAINING_NAMESPACE, pod, MERGE, body, subresource="status")


async def test_a_reclaim_for_a_lent_node_that_was_deleted_evicts_its_pods_then_ends_gone(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        setup = w.actuator(w.writer())
        await setup.lend("gpu-0", "audit-1")
        (pod,) = training(w.objects, "job-a", 1, "gpu-0")
        old = str(node_obj(w.objects, "gpu-0")["metadata"]["uid"])
        w.objects.delete(NODES, None, "gpu-0", DeleteOptions())
        rec = w.writer()
        act = w.actuator(rec)
        deadline = w.now() + timedelta(minutes=5)
        first = await act.reclaim("gpu-0", "audit-2", deadline, uid=old)
        assert first.outcome is Outcome.IN_PROGRESS
        assert first.message.startswith(f"node gpu-0 (uid {old}) was deleted: 1 pod(s) of the ")
        assert f"evicted pod(s) bound to an earlier node of this name: training/{pod}" in (
            first.message
        )
        assert [(x.kind, x.target) for x in first.writes] == [
            (WriteKind.EVICT, f"pod/training/{pod}")
        ]
        w.advance(60)  # its grace period
        done = await act.progress("gpu-0", "audit-2", uid=old, deadline=deadline)
        assert (done.outcome, done.message) == (Outcome.GONE, f"node gpu-0 (uid {old}) was deleted")
        # The DaemonSet's pod is no loan's: the pod garbage collector's.
        assert set(pods_on(w.objects, "gpu-0")) == {"kube-system/gpu-exporter-gpu-0"}
        assert rec.pod_targets == {f"training/{pod}"}


async def test_the_pods_of_a_replaced_node_a_budget_holds_are_deleted_past_the_deadline(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        await w.actuator(w.writer()).lend("gpu-0", "audit-1")
        (pod,) = training(w.objects, "job-a", 1, "gpu-0")
        objects.budget(w.objects, "job-a", min_available=1)
        old = str(node_obj(w.objects, "gpu-0")["metadata"]["uid"])
        recreate(w.objects, "gpu-0")
        act = w.actuator(w.writer())
        deadline = w.now() + timedelta(minutes=2)
        blocked = await act.reclaim("gpu-0", "audit-2", deadline, uid=old)
        assert blocked.outcome is Outcome.IN_PROGRESS
        assert "was replaced" in blocked.message
        assert "1 blocked by a budget" in blocked.message
        assert [x.outcome.value for x in blocked.writes] == ["blocked"]
        w.advance(150)
        past = await act.progress("gpu-0", "audit-2", uid=old, deadline=deadline)
        assert [(x.kind, x.target) for x in past.writes] == [
            (WriteKind.DELETE, f"pod/training/{pod}")
        ]
        assert past.outcome is Outcome.GONE
        assert f"deleted pod(s) bound to an earlier node of this name: training/{pod}" in (
            past.message
        )
        assert set(pods_on(w.objects, "gpu-0")) == {"kube-system/gpu-exporter-gpu-0"}


# How long after the pod was bound the node came back under its name.
@pytest.mark.parametrize("delay", [0, 2, 6, 60])
async def test_borrowed_pods_bound_before_the_node_was_created_are_evicted_and_no_other(
    backend: Backend, delay: int
) -> None:
    async with world("gpu-0", backend=backend) as w:
        await w.actuator(w.writer()).lend("gpu-0", "audit-1")
        (borrowed,) = training(w.objects, "job-a", 1, "gpu-0")
        # A pod that did not tolerate the lent taint: no restarted controller can tell that an
        # earlier node was lent when it landed, so it is not taken for a loan's.
        stray = objects.bound(
            cluster.training_pod("stray", 0, gpus=1, priority_class=None), "gpu-0"
        )
        stray["metadata"]["name"] = "stray"
        stray["spec"]["tolerations"] = []
        objects.add(w.objects, stray)
        recreate(w.objects, "gpu-0")
        created = convert.time_of(node_obj(w.objects, "gpu-0")["metadata"]["creationTimestamp"])
        assert created is not None
        for name in (borrowed, "stray"):
            bound_at(w.objects, name, created - timedelta(seconds=delay))
        rec = w.writer()
        act = w.actuator(rec)
        deadline = w.now() + timedelta(minutes=5)
        first = await act.remove_earlier("gpu-0", "audit-2", deadline)
        if delay == 0:  # bound in the second the node was created: perhaps to this very node
            assert first.outcome is Outcome.APPLIED
            assert first.writes == ()
            assert f"training/{borrowed}" in pods_on(w.objects, "gpu-0")
            return
        assert first.outcome is Outcome.IN_PROGRESS
        assert [(x.kind, x.target) for x in first.writes] == [
            (WriteKind.EVICT, f"pod/training/{borrowed}")
        ]
        w.advance(60)
        done = await act.remove_earlier("gpu-0", "audit-2", deadline)
        assert done.outcome is Outcome.APPLIED
        assert done.message == "no borrowed pod bound to an earlier node of this name is left"
        assert set(pods_on(w.objects, "gpu-0")) == {
            "kube-system/gpu-exporter-gpu-0",
            "training/stray",
        }
        assert rec.pod_targets == {f"training/{borrowed}"}
        assert node_obj(w.objects, "gpu-0")["metadata"]["labels"].get(KEYS.state) is None


async def test_a_pod_a_finalizer_holds_past_the_deadline_is_named_and_not_asked_again() -> None:
    async with world("gpu-0") as w:
        act = w.actuator(w.writer())
        await act.lend("gpu-0", "audit-1")
        pod = objects.bound(cluster.training_pod("job-a", 0, gpus=1, priority_class=None), "gpu-0")
        pod["metadata"]["finalizers"] = ["example.com/checkpoint"]
        objects.add(w.objects, pod)
        first = await act.reclaim("gpu-0", "audit-2", w.now() + timedelta(seconds=5))
        assert first.outcome is Outcome.IN_PROGRESS
        assert first.held == ()  # before the deadline it may yet end on its own
        w.advance(10)  # past the deadline, within the pod's grace period
        deleting = await act.progress("gpu-0")
        assert deleting.outcome is Outcome.IN_PROGRESS
        assert [x.kind for x in deleting.writes] == [WriteKind.DELETE]
        # Not held yet: a finalizer's owner takes it off once the pod stops (the Job
        # controller's, within a second on a real control plane: tests/kubeapi).
        assert deleting.held == ()
        assert "held" not in deleting.message
        past = await act.progress("gpu-0")  # a pass later, still there: held
        assert past.outcome is Outcome.IN_PROGRESS
        assert past.writes == ()  # its deletion with grace 0 is not asked again
        assert past.held == ("training/job-a-0 (example.com/checkpoint)",)
        assert (
            "held past the deadline by finalizers: training/job-a-0 (example.com/checkpoint)"
            in (past.message)
        )
        again = await act.progress("gpu-0")
        assert (again.outcome, again.message, again.held) == (
            Outcome.IN_PROGRESS,
            past.message,
            past.held,
        )
        assert again.writes == ()  # the same words, and no write: nothing changed
        assert node_obj(w.objects, "gpu-0")["metadata"]["labels"][KEYS.state] == "reclaiming"
        # Once someone removes the finalizer, the next pass finishes.
        body = json.dumps({"metadata": {"finalizers": None}}).encode()
        w.objects.patch(PODS, "training", "job-a-0", MERGE, body)
        w.advance(1)
        assert (await act.progress("gpu-0")).outcome is Outcome.APPLIED


def test_a_node_view_knows_its_uid_and_creation() -> None:
    obj = objects.gpu_node("gpu-0")
    obj["metadata"].update(uid="u-1", creationTimestamp="2026-03-02T12:00:00Z")
    view = convert.node_view(convert.slim_node(obj))
    assert view.uid == "u-1"
    assert view.created is not None
    assert view.created.isoformat() == "2026-03-02T12:00:00+00:00"
