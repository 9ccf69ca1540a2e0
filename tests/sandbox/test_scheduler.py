"""The scheduler stand-in: taints and tolerations, node affinity, GPU fit, cordoned nodes."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client, watch

from sandbox.emulator import cluster
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.server import serve
from sandbox.emulator.store import Store
from tests.support.emulated import Sandbox, running
from tests.support.factories import T0
from tests.support.objects import NS, node, pod
from tests.support.waits import next_event

TRAINING = cluster.TRAINING_NAMESPACE


async def _placed(sandbox: Sandbox, name: str, namespace: str = NS) -> str | None:
    read = await sandbox.core.read_namespaced_pod(name, namespace)
    node: str | None = read.spec.node_name  # the client's models are untyped
    return node


@pytest.mark.parametrize(
    ("taint", "toleration", "lands"),
    [
        ({"key": "k", "value": "v", "effect": "NoSchedule"}, None, False),
        ({"key": "k", "value": "v", "effect": "PreferNoSchedule"}, None, True),
        ({"key": "k", "value": "v", "effect": "NoExecute"}, None, False),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            {"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"},
            True,
        ),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            {"key": "k", "value": "v"},
            True,
        ),  # no operator means Equal, no effect matches all
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            {"key": "k", "operator": "Equal", "value": "w"},
            False,
        ),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            {"key": "k", "operator": "Exists"},
            True,
        ),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            {"operator": "Exists"},
            True,
        ),  # an empty key with Exists tolerates everything
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            {"key": "k", "operator": "Exists", "effect": "NoExecute"},
            False,
        ),
        ({"key": "k", "effect": "NoSchedule"}, {"key": "k", "operator": "Equal"}, True),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            {"key": "other", "operator": "Exists"},
            False,
        ),
    ],
)
async def test_taints_are_tolerated_as_kubernetes_matches_them(
    taint: dict[str, str], toleration: dict[str, str] | None, lands: bool
) -> None:
    async with running() as sandbox:
        await sandbox.core.create_node(node("gpu-a", [taint]))
        await sandbox.core.create_namespaced_pod(
            NS, pod("web-0", tolerations=[toleration] if toleration else [])
        )
        sandbox.schedule()
        assert (await _placed(sandbox, "web-0") == "gpu-a") is lands


@pytest.mark.parametrize(
    ("expression", "lands"),
    [
        ({"key": "gen", "operator": "In", "values": ["l20", "a100"]}, True),
        ({"key": "gen", "operator": "In", "values": ["h100"]}, False),
        ({"key": "gen", "operator": "NotIn", "values": ["h100"]}, True),
        ({"key": "missing", "operator": "NotIn", "values": ["x"]}, True),
        ({"key": "gen", "operator": "Exists"}, True),
        ({"key": "gen", "operator": "DoesNotExist"}, False),
        ({"key": "gpus", "operator": "Gt", "values": ["4"]}, True),
        ({"key": "gpus", "operator": "Lt", "values": ["4"]}, False),
        ({"key": "gen", "operator": "Gt", "values": ["4"]}, False),  # not an integer
    ],
)
async def test_required_node_affinity_operators(expression: dict[str, Any], lands: bool) -> None:
    async with running() as sandbox:
        body = node("gpu-a")
        body["metadata"]["labels"].update({"gen": "l20", "gpus": "8"})
        await sandbox.core.create_node(body)
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [expression]}]
                }
            }
        }
        await sandbox.core.create_namespaced_pod(NS, pod("web-0", affinity=affinity))
        sandbox.schedule()
        assert (await _placed(sandbox, "web-0") == "gpu-a") is lands


async def test_a_node_selector_must_match_every_label(sandbox: Sandbox) -> None:
    await sandbox.core.create_node(node("gpu-a"))
    await sandbox.core.create_namespaced_pod(NS, pod("yes", nodeSelector={"gpu-pool": "inference"}))
    await sandbox.core.create_namespaced_pod(
        NS, pod("no", nodeSelector={"gpu-pool": "inference", "zone": "b"})
    )
    sandbox.schedule()
    assert await _placed(sandbox, "yes") == "gpu-a"
    assert await _placed(sandbox, "no") is None


async def test_gpu_requests_are_counted_against_allocatable(sandbox: Sandbox) -> None:
    await sandbox.core.create_node(node("gpu-a", gpus=8))
    for index in range(3):
        body = pod(f"job-{index}")
        body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
        await sandbox.core.create_namespaced_pod(NS, body)
    bound = sandbox.schedule()
    assert [b[1] for b in bound] == ["job-0", "job-1"]
    waiting = await sandbox.core.read_namespaced_pod("job-2", NS)
    condition = next(c for c in waiting.status.conditions if c.type == "PodScheduled")
    assert (condition.status, condition.reason) == ("False", "Unschedulable")
    assert condition.message == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    await sandbox.core.delete_namespaced_pod("job-0", NS)
    sandbox.schedule()
    assert await _placed(sandbox, "job-2") is None  # job-0 still terminating holds its GPUs
    sandbox.clock.advance(30)
    sandbox.schedule()
    assert await _placed(sandbox, "job-2") == "gpu-a"


async def test_a_bound_pod_is_started_and_ready(sandbox: Sandbox) -> None:
    await sandbox.core.create_node(node("gpu-a"))
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    sandbox.schedule()
    started = await sandbox.core.read_namespaced_pod("web-0", NS)
    conditions = {c.type: c.status for c in started.status.conditions}
    assert started.status.phase == "Running"
    assert conditions["Ready"] == "True"
    assert conditions["PodScheduled"] == "True"


async def test_training_waits_until_an_inference_node_is_lent(gpu_cluster: Sandbox) -> None:
    for index in range(5):
        await gpu_cluster.core.create_namespaced_pod(
            TRAINING, cluster.training_pod("pretrain", index)
        )
    bound = gpu_cluster.schedule()
    assert sorted(b[2] for b in bound) == [f"training-{i}" for i in range(4)]
    waiting = await gpu_cluster.core.read_namespaced_pod("pretrain-4", TRAINING)
    message = next(c.message for c in waiting.status.conditions if c.type == "PodScheduled")
    assert message == (
        "0/12 nodes are available: 4 Insufficient nvidia.com/gpu, "
        "8 node(s) had untolerated taint {workload: inference}."
    )
    await gpu_cluster.core.patch_node("inference-5", {"spec": {"taints": [cluster.LEND_TAINT]}})
    bound = gpu_cluster.schedule()
    assert bound == [(TRAINING, "pretrain-4", "inference-5")]


async def test_a_volcano_pod_group_is_bound_all_together_or_not_at_all(
    gpu_cluster: Sandbox,
) -> None:
    # Queued by name (one creation time): a trio, then a pair, then a pod of no group.
    for job, size in (("a-trio", 3), ("b-pair", 2)):
        for index in range(size):
            await gpu_cluster.core.create_namespaced_pod(
                TRAINING, cluster.training_pod(job, index, group=job)
            )
    await gpu_cluster.core.create_namespaced_pod(TRAINING, cluster.training_pod("c-solo", 0))
    bound = gpu_cluster.schedule()  # the pair would fit one pod on the fourth node: it gets none
    assert sorted(b[1] for b in bound) == ["a-trio-0", "a-trio-1", "a-trio-2", "c-solo-0"]
    waiting = await gpu_cluster.core.read_namespaced_pod("b-pair-0", TRAINING)
    message = next(c.message for c in waiting.status.conditions if c.type == "PodScheduled")
    assert message.startswith("pod group b-pair: 1 of 2 pods fit, none is bound: 0/12 nodes")
    await gpu_cluster.core.delete_namespaced_pod("c-solo-0", TRAINING, grace_period_seconds=0)
    assert gpu_cluster.schedule() == []  # one node free: still not both
    await gpu_cluster.core.patch_node("inference-5", {"spec": {"taints": [cluster.LEND_TAINT]}})
    assert sorted(b[1:] for b in gpu_cluster.schedule()) == [
        ("b-pair-0", "inference-5"),
        ("b-pair-1", "training-3"),
    ]


async def test_a_cordoned_node_gets_no_pods_and_carries_the_unschedulable_taint(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_node(node("gpu-a"))
    cordoned = await sandbox.core.patch_node("gpu-a", {"spec": {"unschedulable": True}})
    assert cordoned.spec.taints is None  # the node lifecycle controller adds it a moment later
    read = await sandbox.core.read_node("gpu-a")
    assert [(t.key, t.effect) for t in read.spec.taints] == [
        ("node.kubernetes.io/unschedulable", "NoSchedule")
    ]
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    sandbox.schedule()
    assert await _placed(sandbox, "web-0") is None
    await sandbox.core.patch_node("gpu-a", {"spec": {"unschedulable": False}})
    assert (await sandbox.core.read_node("gpu-a")).spec.taints is None
    sandbox.schedule()
    assert await _placed(sandbox, "web-0") == "gpu-a"


async def test_the_choice_among_nodes_is_deterministic_and_spreads_by_free_share(
    sandbox: Sandbox,
) -> None:
    for name in ("gpu-c", "gpu-a", "gpu-b"):
        await sandbox.core.create_node(node(name))
    for index in range(4):
        body = pod(f"job-{index}")
        body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
        await sandbox.core.create_namespaced_pod(NS, body)
    assert [b[2] for b in sandbox.schedule()] == ["gpu-a", "gpu-b", "gpu-c", "gpu-a"]


async def test_higher_priority_pods_are_placed_first(sandbox: Sandbox) -> None:
    await sandbox.core.create_node(node("gpu-a", gpus=8))
    for name, priority in (("low", 0), ("high", 1000)):
        body = pod(name, priority=priority)
        body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
        await sandbox.core.create_namespaced_pod(NS, body)
    assert [b[1] for b in sandbox.schedule()] == ["high"]


async def test_the_scheduler_can_run_on_an_interval() -> None:
    store = Store(ManualClock(T0), seed=1)
    async with (
        serve(store, schedule_every=0.01) as url,
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        core: Any = client.CoreV1Api(api)
        await core.create_node(node("gpu-a"))
        before = await core.list_namespaced_pod(NS)
        await core.create_namespaced_pod(NS, pod("web-0"))
        async with watch.Watch() as w:
            stream = w.stream(
                core.list_namespaced_pod,
                NS,
                resource_version=before.metadata.resource_version,
                timeout_seconds=3600,
            )
            added, bound = await next_event(stream), await next_event(stream)
    assert added["type"] == "ADDED"
    assert "nodeName" not in added["raw_object"]["spec"]
    assert bound["raw_object"]["spec"]["nodeName"] == "gpu-a"
