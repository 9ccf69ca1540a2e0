"""The actuator against the emulator over HTTP, through the real kubernetes-asyncio client.

The kit (a node with several taints in a deliberate order, a recording writer, ``drive``) is
``tests.support.actuation``; the two writers here meddle with the cluster mid-call.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from rebalancer.adapters import convert
from rebalancer.core.nodestate import NodeChange, lent_taints
from rebalancer.core.outcomes import Outcome, WriteKind, WriteOutcome
from sandbox.emulator import cluster
from sandbox.emulator.resources import NODES
from tests.support import objects
from tests.support.actuation import KEYS, LEND, SPEC, Forwarding, drive, world
from tests.support.backends import Backend, Objects
from tests.support.objects import TAINTS, budget, gpu_node, training
from tests.support.reads import node_obj, pods_on, scheduling_of

Obj = dict[str, Any]


async def test_a_lend_swaps_taints_in_place_and_a_reclaim_restores_them_byte_for_byte(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        labels, taints = scheduling_of(w.objects, "gpu-0")
        act = w.actuator(w.writer())
        lent = await act.lend("gpu-0", "audit-1")
        assert lent.outcome is Outcome.APPLIED
        assert [x.kind for x in lent.writes] == [WriteKind.BEGIN_LEND, WriteKind.FINISH_LEND]
        obj = node_obj(w.objects, "gpu-0")
        assert convert.taints(obj) == lent_taints(convert.taints(gpu_node("gpu-0")), SPEC)
        assert obj["metadata"]["labels"][KEYS.state] == "lent"
        assert obj["metadata"]["labels"]["gpu-pool"] == "training"
        back = await act.reclaim("gpu-0", "audit-2", w.now() + timedelta(minutes=5))
        assert back.outcome is Outcome.APPLIED  # no borrowed pod: finished in the same call
        assert scheduling_of(w.objects, "gpu-0") == (labels, taints)
        assert KEYS.original not in node_obj(w.objects, "gpu-0")["metadata"]["annotations"]


async def test_a_node_running_inference_is_refused_and_not_written(backend: Backend) -> None:
    async with world("gpu-0", backend=backend) as w:
        objects.add(w.objects, cluster.inference_pod(0, node_name="gpu-0"))
        before = node_obj(w.objects, "gpu-0")["metadata"]["resourceVersion"]
        rec = w.writer()
        result = await w.actuator(rec).lend("gpu-0", "audit-1")
        assert result.outcome is Outcome.REFUSED
        assert "llm-serving" in result.message
        assert rec.writes == []
        assert node_obj(w.objects, "gpu-0")["metadata"]["resourceVersion"] == before


async def test_a_reclaim_restores_taints_first_then_evicts_only_borrowed_pods(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        rec = w.writer()
        act = w.actuator(rec)
        await act.lend("gpu-0", "audit-1")
        borrowed = training(w.objects, "job-a", 2, "gpu-0")
        objects.add(w.objects, cluster.inference_pod(7, node_name="gpu-0"))
        result = await act.reclaim("gpu-0", "audit-2", w.now() + timedelta(minutes=5))
        assert result.outcome is Outcome.IN_PROGRESS  # evicted pods terminate for 60 s
        kinds = [x.kind for x in result.writes]
        assert kinds == [WriteKind.BEGIN_RECLAIM, WriteKind.EVICT, WriteKind.EVICT]
        assert rec.pod_targets == {f"training/{n}" for n in borrowed}
        assert node_obj(w.objects, "gpu-0")["spec"]["taints"] == TAINTS  # nothing new lands
        done = await drive(act, "gpu-0", result, w)
        assert done.outcome is Outcome.APPLIED
        assert set(pods_on(w.objects, "gpu-0")) == {
            "kube-system/gpu-exporter-gpu-0",
            "inference/llm-serving-7d9f8c6b5-00007",
        }


async def test_a_budget_delays_the_reclaim_until_the_deadline_then_the_pods_are_deleted(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        act = w.actuator(w.writer())
        await act.lend("gpu-0", "audit-1")
        names = training(w.objects, "job-a", 2, "gpu-0")
        budget(w.objects, "job-a", min_available=2)
        deadline = w.now() + timedelta(minutes=5)
        first = await act.reclaim("gpu-0", "audit-2", deadline)
        assert first.outcome is Outcome.IN_PROGRESS
        assert {x.outcome for x in first.writes[1:]} == {WriteOutcome.BLOCKED}
        w.advance(240)  # four minutes: still before the deadline
        second = await act.progress("gpu-0")
        assert second.outcome is Outcome.IN_PROGRESS
        assert [x.kind for x in second.writes] == [WriteKind.EVICT, WriteKind.EVICT]
        assert all(
            "deletionTimestamp" not in p["metadata"] for p in pods_on(w.objects, "gpu-0").values()
        )
        w.advance(60)  # the deadline
        last = await act.progress("gpu-0")
        assert last.outcome is Outcome.APPLIED
        assert [x.kind for x in last.writes] == [WriteKind.DELETE] * 2 + [WriteKind.FINISH]
        assert {x.target for x in last.writes[:2]} == {f"pod/training/{n}" for n in names}
        assert set(pods_on(w.objects, "gpu-0")) == {"kube-system/gpu-exporter-gpu-0"}
        assert node_obj(w.objects, "gpu-0")["spec"]["taints"] == TAINTS


async def test_a_conflict_on_the_first_write_aborts_the_lend_and_writes_nothing(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        meddler = Meddler(w.writer(), w.objects, before_patch=1)
        result = await w.actuator(meddler).lend("gpu-0", "audit-1")
        assert result.outcome is Outcome.CONFLICT
        assert "409" in result.message
        assert result.writes == ()
        assert KEYS.state not in node_obj(w.objects, "gpu-0")["metadata"]["labels"]


async def test_a_conflict_mid_lend_is_reported_and_the_next_pass_rolls_the_node_back(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        labels, taints = scheduling_of(w.objects, "gpu-0")
        meddler = Meddler(w.writer(), w.objects, before_patch=2)
        result = await w.actuator(meddler).lend("gpu-0", "audit-1")
        assert result.outcome is Outcome.CONFLICT
        assert [x.kind for x in result.applied] == [WriteKind.BEGIN_LEND]
        assert node_obj(w.objects, "gpu-0")["metadata"]["labels"][KEYS.state] == "lending"
        recovered = await w.actuator(w.writer()).progress("gpu-0")  # the next pass on it
        assert recovered.outcome is Outcome.APPLIED
        assert scheduling_of(w.objects, "gpu-0") == (labels, taints)


async def test_a_conflict_mid_reclaim_is_reported_and_the_next_pass_finishes(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        labels, taints = scheduling_of(w.objects, "gpu-0")
        await w.actuator(w.writer()).lend("gpu-0", "audit-1")
        # The finish write (the second patch of the reclaim) meets a changed node.
        meddler = Meddler(w.writer(), w.objects, before_patch=2)
        result = await w.actuator(meddler).reclaim("gpu-0", "audit-2", w.now())
        assert result.outcome is Outcome.CONFLICT
        assert [x.kind for x in result.applied] == [WriteKind.BEGIN_RECLAIM]
        assert scheduling_of(w.objects, "gpu-0")[1] == taints  # already safe for inference
        recovered = await w.actuator(w.writer()).progress("gpu-0")  # the next pass on it
        assert recovered.outcome is Outcome.APPLIED
        assert scheduling_of(w.objects, "gpu-0") == (labels, taints)


async def test_dry_run_writes_nothing_and_reports_the_exact_writes_it_would_make(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        rv = node_obj(w.objects, "gpu-0")["metadata"]["resourceVersion"]
        rec = w.writer()
        result = await w.actuator(rec, dry_run=True).lend("gpu-0", "audit-1")
        assert rec.writes == []
        assert node_obj(w.objects, "gpu-0")["metadata"]["resourceVersion"] == rv
        assert result.dry_run
        assert result.outcome is Outcome.WOULD_APPLY  # never "applied": nothing was
        assert result.message == "would lend (lent): 2 writes not sent"
        assert [(x.kind, x.outcome) for x in result.writes] == [
            (WriteKind.BEGIN_LEND, WriteOutcome.PLANNED),
            (WriteKind.FINISH_LEND, WriteOutcome.PLANNED),
        ]
        begin, finish = (x.body for x in result.writes)
        assert begin["metadata"]["resourceVersion"] == rv
        assert begin["metadata"]["labels"] == {KEYS.state: "lending"}
        assert "spec" not in begin  # begin_lend changes nothing that schedules
        lend_taint = {"key": LEND.key, "value": "training", "effect": "NoSchedule"}
        assert finish["spec"]["taints"] == [TAINTS[0], TAINTS[2], lend_taint]


async def test_dry_run_of_a_reclaim_lists_the_evictions_without_sending_them(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        await w.actuator(w.writer()).lend("gpu-0", "audit-1")
        names = training(w.objects, "job-a", 2, "gpu-0")
        rv = node_obj(w.objects, "gpu-0")["metadata"]["resourceVersion"]
        rec = w.writer()
        deadline = w.now() + timedelta(minutes=5)
        result = await w.actuator(rec, dry_run=True).reclaim("gpu-0", "audit-2", deadline)
        assert rec.writes == []
        assert node_obj(w.objects, "gpu-0")["metadata"]["resourceVersion"] == rv
        assert [x.kind for x in result.writes] == [WriteKind.BEGIN_RECLAIM] + [WriteKind.EVICT] * 2
        assert {x.target for x in result.writes[1:]} == {f"pod/training/{n}" for n in names}
        assert result.writes[1].body["kind"] == "Eviction"
        assert result.outcome is Outcome.WOULD_APPLY
        assert result.message == (
            "would reclaim (borrowed pods would be evicted or deleted): 3 writes not sent"
        )


@dataclass
class Meddler(Forwarding):
    """Someone else writes the node just before the actuator's ``before_patch``-th patch."""

    store: Objects
    before_patch: int
    patches: int = 0

    async def patch_node(self, name: str, change: NodeChange, resource_version: str) -> Obj:
        self.patches += 1
        if self.patches == self.before_patch:
            body = b'{"metadata": {"annotations": {"example.com/owner": "someone-else"}}}'
            self.store.patch(NODES, None, name, "application/merge-patch+json", body)
        return await self.inner.patch_node(name, change, resource_version)


@dataclass
class Arrival(Forwarding):
    """An inference pod is bound to the node right after the actuator's first look at its pods."""

    store: Objects
    lists: int = 0

    async def list_pods(self, node: str) -> list[Obj]:
        out = await self.inner.list_pods(node)
        self.lists += 1
        if self.lists == 1:
            objects.add(self.store, cluster.inference_pod(3, node_name=node))
        return out


async def test_a_node_that_becomes_busy_during_the_lend_is_rolled_back_before_any_taint_moves(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        labels, taints = scheduling_of(w.objects, "gpu-0")
        rec = w.writer()
        result = await w.actuator(Arrival(rec, w.objects)).lend("gpu-0", "audit-1")
        assert result.outcome is Outcome.REFUSED
        assert "became busy" in result.message
        assert [x.kind for x in result.applied] == [WriteKind.BEGIN_LEND, WriteKind.FINISH]
        assert rec.states == {"gpu-0": ["lending", "serving"]}
        assert scheduling_of(w.objects, "gpu-0") == (labels, taints)
        assert rec.pod_targets == set()  # the inference pod is left alone
