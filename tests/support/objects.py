"""Kubernetes objects for a test's cluster, and the writes a test makes to it behind the
client's back (as another actor of the cluster would), on either backend (``backends.Objects``:
the emulator's store or a real kube-apiserver).

Bodies are plain dicts, as the API takes them; ``sandbox.emulator.cluster`` has the default
cluster's nodes and pods, these are the shapes the tests add to it: a node with several taints in
a deliberate order, a DaemonSet pod, training pods bound to a node, a budget over a job.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from sandbox.emulator import cluster
from sandbox.emulator.resources import NODES, PDBS, PODS
from tests.support.backends import Objects

Obj = dict[str, Any]
NS = "inference"  # where ``pod`` puts a pod unless told otherwise
_MERGE = "application/merge-patch+json"

# The inference taint sits between two others, and one taint carries timeAdded: a restore that
# appends, re-sorts or drops a field shows.
TAINTS: list[Obj] = [
    {"key": "example.com/spot", "effect": "PreferNoSchedule"},
    {"key": "workload", "value": "inference", "effect": "NoSchedule"},
    {
        "key": "example.com/maintenance",
        "value": "planned",
        "effect": "PreferNoSchedule",
        "timeAdded": "2026-03-01T08:00:00Z",
    },
]


_KINDS = {"Node": NODES, "Pod": PODS, "PodDisruptionBudget": PDBS}


def add(target: Objects, obj: Obj) -> Obj:
    """Create a Node, Pod or PodDisruptionBudget; what the server stored."""
    return target.create(_KINDS[obj["kind"]], obj["metadata"].get("namespace"), obj)


def pod(name: str, namespace: str = NS, **spec: Any) -> Obj:
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}], **spec},
    }
    return body


def node(name: str, taints: list[dict[str, str]] | None = None, gpus: int = 8) -> Obj:
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"gpu-pool": "inference"}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {
                "cpu": "8",
                "memory": "64Gi",
                "pods": "110",
                "nvidia.com/gpu": str(gpus),
            }
        },
    }
    return body


def gpu_node(name: str) -> Obj:
    """An inference node of the default cluster, with ``TAINTS`` in their deliberate order."""
    body = cluster.node(name, cluster.INFERENCE)
    body["spec"]["taints"] = copy.deepcopy(TAINTS)
    return body


def bound(pod: Obj, node: str) -> Obj:
    pod["spec"]["nodeName"] = node
    return pod


def daemon_pod(node: str) -> Obj:
    """A DaemonSet's pod on ``node``: never borrowed, never evicted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"gpu-exporter-{node}",
            "namespace": "kube-system",
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-exporter", "uid": "d"}
            ],
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "exporter", "image": "nvidia/dcgm-exporter:3.3"}],
        },
    }


def training(store: Objects, job: str, count: int, node: str, priority: int = 0) -> list[str]:
    """``count`` pods of training job ``job`` bound to ``node``; their names."""
    names = []
    for index in range(count):
        pod = bound(cluster.training_pod(job, index, gpus=1, priority_class=None), node)
        pod["spec"]["priority"] = priority
        names.append(add(store, pod)["metadata"]["name"])
    return names


def budget(store: Objects, job: str, min_available: int) -> None:
    add(
        store,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": job, "namespace": cluster.TRAINING_NAMESPACE},
            "spec": {"selector": {"matchLabels": {"job-name": job}}, "minAvailable": min_available},
        },
    )


def annotate(store: Objects, node: str, annotations: dict[str, str | None]) -> str:
    """Merge-patch a node's annotations; the new resourceVersion."""
    body = json.dumps({"metadata": {"annotations": annotations}}).encode()
    return str(store.patch(NODES, None, node, _MERGE, body)["metadata"]["resourceVersion"])


def label(store: Objects, node: str, labels: dict[str, str | None]) -> str:
    """Merge-patch a node's labels; the new resourceVersion."""
    body = json.dumps({"metadata": {"labels": labels}}).encode()
    return str(store.patch(NODES, None, node, _MERGE, body)["metadata"]["resourceVersion"])


def finish_pod(store: Objects, namespace: str, name: str) -> None:
    """The pod's containers ended: phase ``Succeeded``, as its kubelet reports it."""
    body = json.dumps({"status": {"phase": "Succeeded"}}).encode()
    store.patch(PODS, namespace, name, _MERGE, body, subresource="status")
