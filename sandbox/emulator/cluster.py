"""Builders for the sandbox's default cluster and the pods that run on it.

Two GPU pools, as the project's lend/reclaim design assumes: eight inference nodes
(``gpu-pool=inference``, tainted ``workload=inference:NoSchedule``, NVIDIA L20) and four training
nodes (``gpu-pool=training``, tainted ``workload=training:NoSchedule``, A100 80 GB), eight GPUs
each. ``inference_pod`` makes a replica of a Deployment-like serving workload (owned by a
ReplicaSet, so a ``maxUnavailable`` budget can count it); ``training_pod`` makes a worker of a
preemptible Job (``batch.kubernetes.io/job-name``) that tolerates the lend taint
``rebalancer.io/lent=training:NoSchedule`` and the training pool's own taint, and only the GPU
nodes. The objects are plain dicts, written to a store with ``seed`` or ``add``.

``HETEROGENEOUS`` is the demo's cluster: an L20 and a T4 inference pool and an A100 training
pool, every node labelled as GPU Feature Discovery labels it (product, family, memory, compute
capability), so a job's node affinity can ask for the GPU it needs; its training pods may be
members of a Volcano PodGroup (``group``), which the scheduler stand-in places all or none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandbox.emulator import scheduling
from sandbox.emulator.resources import NODES, PDBS, PODS
from sandbox.emulator.store import Store

Obj = dict[str, Any]

GPU = "nvidia.com/gpu"
INFERENCE_TAINT = {"key": "workload", "value": "inference", "effect": "NoSchedule"}
TRAINING_TAINT = {"key": "workload", "value": "training", "effect": "NoSchedule"}
LEND_TAINT = {"key": "rebalancer.io/lent", "value": "training", "effect": "NoSchedule"}
INFERENCE_NAMESPACE = "inference"
TRAINING_NAMESPACE = "training"


@dataclass(frozen=True, slots=True)
class Pool:
    name: str  # the gpu-pool label and the node name prefix
    size: int
    product: str
    taint: Mapping[str, str]
    gpus: int = 8
    # GPU Feature Discovery's other labels, written when given (``nvidia.com/gpu.family``,
    # ``.memory`` in MiB, ``.compute.major``/``.minor``): what a job's node affinity reads.
    family: str | None = None
    memory: int | None = None
    compute: tuple[int, int] | None = None

    def gpu_labels(self) -> dict[str, str]:
        labels = {"nvidia.com/gpu.product": self.product, "nvidia.com/gpu.count": str(self.gpus)}
        if self.family is not None:
            labels["nvidia.com/gpu.family"] = self.family
        if self.memory is not None:
            labels["nvidia.com/gpu.memory"] = str(self.memory)
        if self.compute is not None:
            labels["nvidia.com/gpu.compute.major"] = str(self.compute[0])
            labels["nvidia.com/gpu.compute.minor"] = str(self.compute[1])
        return labels


INFERENCE = Pool("inference", 8, "NVIDIA-L20", INFERENCE_TAINT)
TRAINING = Pool("training", 4, "NVIDIA-A100-SXM4-80GB", TRAINING_TAINT)
DEFAULT_POOLS = (INFERENCE, TRAINING)

# A heterogeneous cluster, labelled as GPU Feature Discovery labels it: two inference pools of
# different cards and a training pool (the demo's).
L20 = Pool("l20", 8, "NVIDIA-L20", INFERENCE_TAINT, 8, "ada", 46068, (8, 9))
T4 = Pool("t4", 4, "NVIDIA-Tesla-T4", INFERENCE_TAINT, 4, "turing", 15360, (7, 5))
A100 = Pool("a100", 4, "NVIDIA-A100-SXM4-80GB", TRAINING_TAINT, 8, "ampere", 81920, (8, 0))
HETEROGENEOUS = (L20, T4, A100)


def node(name: str, pool: Pool) -> Obj:
    capacity = {"cpu": "96", "memory": "1536Gi", "pods": "110", GPU: str(pool.gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "gpu-pool": pool.name,
                **pool.gpu_labels(),
            },
        },
        "spec": {"taints": [dict(pool.taint)]},
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "nodeInfo": _node_info(name),
        },
    }


def _node_info(name: str) -> Obj:
    # Every field NodeSystemInfo requires: typed clients refuse a node without them.
    return {
        "architecture": "amd64",
        "bootID": _uid(f"boot/{name}"),
        "containerRuntimeVersion": "containerd://1.7.22",
        "kernelVersion": "6.8.0-45-generic",
        "kubeProxyVersion": "",
        "kubeletVersion": "v1.34.0",
        "machineID": _uid(f"machine/{name}").replace("-", ""),
        "operatingSystem": "linux",
        "osImage": "Ubuntu 24.04.1 LTS",
        "systemUUID": _uid(f"system/{name}"),
    }


def pool_nodes(pool: Pool) -> list[Obj]:
    return [node(f"{pool.name}-{i}", pool) for i in range(pool.size)]


def seed(store: Store, pools: tuple[Pool, ...] = DEFAULT_POOLS) -> None:
    """Create the pools' nodes in ``store``."""
    for pool in pools:
        for obj in pool_nodes(pool):
            store.create(NODES, None, obj)


def _uid(text: str) -> str:
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"


def replica_set_uid(deployment: str = "llm-serving", namespace: str = INFERENCE_NAMESPACE) -> str:
    """The uid ``inference_pod`` gives the ReplicaSet owning its replicas."""
    return _uid(f"{namespace}/{deployment}-7d9f8c6b5")


def inference_pod(
    index: int,
    deployment: str = "llm-serving",
    gpus: int = 1,
    node_name: str | None = None,
    namespace: str = INFERENCE_NAMESPACE,
    pool: str = INFERENCE.name,
) -> Obj:
    """Replica ``index`` of a serving Deployment, pinned to an inference pool."""
    replica_set = f"{deployment}-7d9f8c6b5"
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{replica_set}-{index:05d}",
            "namespace": namespace,
            "labels": {"app": deployment, "pod-template-hash": "7d9f8c6b5"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": replica_set,
                    "uid": _uid(f"{namespace}/{replica_set}"),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeSelector": {"gpu-pool": pool},
            "tolerations": [{**INFERENCE_TAINT, "operator": "Equal"}],
            "terminationGracePeriodSeconds": 30,
            "containers": [_container("server", "vllm/vllm-openai:v0.6.3", gpus)],
        },
    }
    if node_name is not None:
        pod["spec"]["nodeName"] = node_name
    return pod


def training_pod(
    job: str,
    index: int,
    gpus: int = 8,
    namespace: str = TRAINING_NAMESPACE,
    priority_class: str | None = "preemptible",
    needs: Sequence[Obj] = (),
    group: str | None = None,
    pools: Sequence[str] = ("training", "inference"),
) -> Obj:
    """Worker ``index`` of a preemptible training Job: any GPU node of ``pools`` it is let onto
    whose labels meet ``needs`` (node selector requirements, ``nvidia.com/gpu.family In
    [hopper]``). With a ``group`` it is a member of that Volcano PodGroup, scheduled by
    ``volcano`` with its other members, all or none."""
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{index}",
            "namespace": namespace,
            "labels": {
                "batch.kubernetes.io/job-name": job,
                "job-name": job,
                "batch.kubernetes.io/job-completion-index": str(index),
                "workload": "training",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job,
                    "uid": _uid(f"{namespace}/{job}"),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 60,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "gpu-pool",
                                        "operator": "In",
                                        "values": list(pools),
                                    },
                                    *(dict(n) for n in needs),
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [
                {**LEND_TAINT, "operator": "Equal"},
                {**TRAINING_TAINT, "operator": "Equal"},
            ],
            "containers": [_container("trainer", "pytorch/pytorch:2.4.0-cuda12.4", gpus)],
        },
    }
    if priority_class is not None:
        pod["spec"]["priorityClassName"] = priority_class
    if group is not None:
        pod["metadata"]["annotations"] = {scheduling.GROUP_ANNOTATION: group}
        pod["spec"]["schedulerName"] = scheduling.VOLCANO
    return pod


def _container(name: str, image: str, gpus: int) -> Obj:
    return {
        "name": name,
        "image": image,
        "resources": {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}},
    }


def inference_budget(
    name: str = "llm-serving",
    app: str = "llm-serving",
    min_available: int | str | None = None,
    max_unavailable: int | str | None = 1,
    namespace: str = INFERENCE_NAMESPACE,
) -> Obj:
    spec: Obj = {"selector": {"matchLabels": {"app": app}}}
    if min_available is not None:
        spec["minAvailable"] = min_available
        max_unavailable = None
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def add(store: Store, obj: Obj) -> Obj:
    """Create a Node, Pod or PodDisruptionBudget built here."""
    kinds = {"Node": NODES, "Pod": PODS, "PodDisruptionBudget": PDBS}
    rt = kinds[obj["kind"]]
    return store.create(rt, obj["metadata"].get("namespace"), obj)
