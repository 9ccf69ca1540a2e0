"""``pools.apply`` on a cluster: the default GPU cluster (8 L20 inference nodes, 4 A100
training nodes) and a CPU node no pool selects, on the API emulator and on a real kube-apiserver.

PATCH requests are counted from the log of what the test's client asked (``Opened.requests``);
the writers that meddle write the node behind the apply's back, between its read and its write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rebalancer.adapters import convert
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.writer import KubeWriter, RetryPolicy
from rebalancer.commands import pools as pools_command
from rebalancer.core import model, nodepools
from rebalancer.core.nodepools import Verdict
from rebalancer.core.nodestate import NodeChange
from rebalancer.core.outcomes import Outcome
from sandbox.emulator import cluster
from sandbox.emulator.resources import NODES
from tests.support import objects
from tests.support.actuation import KEYS, MARKS, SPEC, Forwarding
from tests.support.backends import Backend, Objects, Opened
from tests.support.reads import node_obj
from tests.support.waits import no_sleep

Obj = dict[str, Any]
POOLS = """
pools:
  - name: inference-l20
    selector: {matchLabels: {nvidia.com/gpu.product: NVIDIA-L20}}
    labels: {gpu-pool: inference-l20, workload-type: inference}
    taints: [workload=inference:NoSchedule]
  - name: training-a100
    selector:
      matchExpressions:
        - {key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-A100-SXM4-80GB]}
    labels: {gpu-pool: training-a100, workload-type: training, batch-scheduling: enabled}
    taints: [workload=training:NoSchedule]
"""
# A third pool that also selects every L20 node: the file no longer says where they belong.
OVERLAPPING = (
    POOLS
    + """
  - name: any-gpu
    selector:
      matchExpressions: [{key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-L20, H100]}]
    labels: {tier: gpu}
"""
)
INFERENCE = [f"inference-{i}" for i in range(8)]
TRAINING = [f"training-{i}" for i in range(4)]


def layout(tmp_path: Path, text: str = POOLS) -> nodepools.Layout:
    path = tmp_path / "pools.yaml"
    path.write_text(text, encoding="utf-8")
    return pools_command.load(path, KEYS)


@pytest.fixture
async def gpus(backend: Backend) -> AsyncIterator[Opened]:
    """The default GPU cluster and a CPU node."""
    async with backend.open(seeded=True) as opened:
        cpu = cluster.node("cpu-0", cluster.INFERENCE)
        del cpu["metadata"]["labels"]["nvidia.com/gpu.product"]
        del cpu["metadata"]["labels"]["nvidia.com/gpu.count"]
        cpu["spec"]["taints"] = []
        objects.add(opened.objects, cpu)
        yield opened


def writer(opened: Opened) -> KubeWriter:
    return KubeWriter(opened.core, RetryPolicy(sleep=no_sleep))


def patches(opened: Opened) -> int:
    return sum(1 for r in opened.requests.seen if r.method == "PATCH")


def scheduling(store: Objects, name: str) -> tuple[dict[str, str], list[Obj]]:
    obj = node_obj(store, name)
    return dict(obj["metadata"].get("labels") or {}), list(obj["spec"].get("taints") or [])


async def lend(opened: Opened, node: str) -> None:
    """The controller lends ``node``, as it would."""
    actuator = Actuator(writer(opened), KEYS, SPEC, MARKS, opened.clock)
    assert (await actuator.lend(node, "test-lend")).outcome is Outcome.APPLIED


# ---------------------------------------------------------------------------------------------


async def test_apply_assigns_every_node_and_a_second_apply_sends_no_write(
    gpus: Opened, tmp_path: Path
) -> None:
    pools = layout(tmp_path)
    first = await pools_command.apply(writer(gpus), pools, KEYS)
    assert first.complete
    assert sum(r.written for r in first.results) == 12
    assert patches(gpus) == 12
    labels, taints = scheduling(gpus.objects, "training-2")
    assert labels["gpu-pool"] == "training-a100"
    assert labels["batch-scheduling"] == "enabled"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"  # not the file's: kept
    assert taints == [cluster.TRAINING_TAINT]
    labels, taints = scheduling(gpus.objects, "inference-0")
    assert (labels["gpu-pool"], labels["workload-type"]) == ("inference-l20", "inference")
    assert taints == [cluster.INFERENCE_TAINT]
    unmatched = [r.plan.node for r in first.results if r.plan.verdict is Verdict.UNMATCHED]
    assert unmatched == ["cpu-0"]

    second = await pools_command.apply(writer(gpus), pools, KEYS)
    assert second.complete
    assert nodepools.summary(second.plans)[Verdict.UNCHANGED] == 12
    assert patches(gpus) == 12  # not one more


async def test_a_node_moved_to_another_pool_swaps_its_taint_and_loses_the_old_pools_labels(
    gpus: Opened, tmp_path: Path
) -> None:
    pools = layout(tmp_path)
    await pools_command.apply(writer(gpus), pools, KEYS)
    # Its GPUs were swapped: the labeler now says L20.
    objects.label(gpus.objects, "training-1", {"nvidia.com/gpu.product": "NVIDIA-L20"})
    objects.label(gpus.objects, "training-1", {"team": "search"})
    report = await pools_command.apply(writer(gpus), pools, KEYS)
    (moved,) = [r for r in report.results if r.written]
    assert moved.plan.edits == [
        "+label gpu-pool=inference-l20 (was training-a100)",
        "+label workload-type=inference (was training)",
        "-label batch-scheduling",
        "+taint workload=inference:NoSchedule",
        "-taint workload=training:NoSchedule",
    ]
    labels, taints = scheduling(gpus.objects, "training-1")
    assert "batch-scheduling" not in labels
    assert labels["team"] == "search"
    assert taints == [cluster.INFERENCE_TAINT]


async def test_a_lent_node_is_refused_and_left_as_the_lend_left_it(
    gpus: Opened, tmp_path: Path
) -> None:
    await lend(gpus, "inference-5")
    lent = scheduling(gpus.objects, "inference-5")
    report = await pools_command.apply(writer(gpus), layout(tmp_path), KEYS)
    assert not report.complete
    (refused,) = [r.plan for r in report.results if r.plan.verdict is Verdict.REFUSED]
    assert (refused.node, refused.refusal, refused.pools) == (
        "inference-5",
        "lent",
        ("inference-l20",),
    )
    assert scheduling(gpus.objects, "inference-5") == lent
    assert sum(r.written for r in report.results) == 11  # the others are applied


async def test_a_dry_run_sends_no_write_and_plans_what_the_apply_then_writes(
    gpus: Opened, tmp_path: Path
) -> None:
    pools = layout(tmp_path)
    before = {n: scheduling(gpus.objects, n) for n in INFERENCE + TRAINING}
    dry = await pools_command.apply(writer(gpus), pools, KEYS, dry_run=True)
    assert patches(gpus) == 0
    assert {n: scheduling(gpus.objects, n) for n in INFERENCE + TRAINING} == before
    assert dry.complete
    assert not any(r.written for r in dry.results)
    real = await pools_command.apply(writer(gpus), pools, KEYS)
    assert [r.plan for r in real.results] == dry.plans


async def test_a_node_two_pools_select_stops_the_apply_before_any_write(
    gpus: Opened, tmp_path: Path
) -> None:
    report = await pools_command.apply(writer(gpus), layout(tmp_path, OVERLAPPING), KEYS)
    assert [p.node for p in report.overlap] == INFERENCE
    assert report.overlap[0].pools == ("inference-l20", "any-gpu")
    assert not report.complete
    assert patches(gpus) == 0  # not even the training nodes, which only one pool selects


@dataclass
class Meddler(Forwarding):
    """Another writer changes the node between the apply's read and its write: before the first
    ``times`` patches of ``node``, ``meddle`` runs."""

    node: str
    meddle: Any  # an async function of no arguments
    times: int = 1
    sent: list[str] = field(default_factory=list)

    async def patch_node(self, name: str, change: NodeChange, resource_version: str) -> Obj:
        if name == self.node and self.sent.count(name) < self.times:
            await self.meddle()
        self.sent.append(name)
        return await self.inner.patch_node(name, change, resource_version)

    async def evict(self, namespace: str, name: str, uid: str) -> Any:
        raise AssertionError("the pool manager never evicts")

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        raise AssertionError("the pool manager never deletes a pod")

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> bool:
        raise AssertionError("the pool manager never writes a pod")

    async def set_pod_condition(
        self, namespace: str, name: str, uid: str, condition: Mapping[str, str]
    ) -> bool:
        raise AssertionError("the pool manager never writes a pod")


async def test_a_409_reads_the_node_again_and_plans_on_what_the_other_writer_left(
    gpus: Opened, tmp_path: Path
) -> None:
    async def meddle() -> None:  # a label of someone else's and a taint the file owns
        body = b'{"metadata": {"labels": {"team": "search"}}, "spec": {"taints": [' + (
            b'{"key": "workload", "value": "training", "effect": "NoSchedule"}]}}'
        )
        gpus.objects.patch(NODES, None, "inference-2", "application/merge-patch+json", body)

    meddler = Meddler(writer(gpus), "inference-2", meddle)
    report = await pools_command.apply(meddler, layout(tmp_path), KEYS)
    assert report.complete
    (raced,) = [r for r in report.results if r.plan.node == "inference-2"]
    assert (raced.written, raced.attempts) == (True, 2)
    assert "-taint workload=training:NoSchedule" in raced.plan.edits  # planned again
    labels, taints = scheduling(gpus.objects, "inference-2")
    assert (labels["team"], labels["gpu-pool"]) == ("search", "inference-l20")
    assert taints == [cluster.INFERENCE_TAINT]


async def test_a_node_lent_between_the_read_and_the_write_is_refused_not_overwritten(
    gpus: Opened, tmp_path: Path
) -> None:
    async def meddle() -> None:
        await lend(gpus, "inference-4")

    meddler = Meddler(writer(gpus), "inference-4", meddle)
    report = await pools_command.apply(meddler, layout(tmp_path), KEYS)
    (raced,) = [r for r in report.results if r.plan.node == "inference-4"]
    assert (raced.plan.verdict, raced.plan.refusal, raced.written) == (
        Verdict.REFUSED,
        "lent",
        False,
    )
    view = convert.node_view(node_obj(gpus.objects, "inference-4"))
    assert model.Taint(KEYS.lent_taint, "NoSchedule", "training") in view.taints
    assert "workload-type" not in view.labels


async def test_a_node_that_changes_before_every_write_is_reported_after_three(
    gpus: Opened, tmp_path: Path
) -> None:
    async def meddle() -> None:
        objects.annotate(
            gpus.objects, "inference-1", {"example.com/touched": str(len(meddler.sent))}
        )

    meddler = Meddler(writer(gpus), "inference-1", meddle, times=pools_command.ATTEMPTS)
    report = await pools_command.apply(meddler, layout(tmp_path), KEYS)
    (raced,) = report.failed
    assert raced.plan.node == "inference-1"
    assert raced.attempts == pools_command.ATTEMPTS
    assert raced.error == "changed by another writer before each of 3 writes; run again"
    assert "workload-type" not in scheduling(gpus.objects, "inference-1")[0]
    assert not report.complete
    assert sum(r.written for r in report.results) == 11
