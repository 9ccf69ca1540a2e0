"""An inference pool of KWOK GPU nodes and a training Job on the real control plane
(``control_plane.running``), for the end-to-end suite where training is real batch/v1 Jobs
(``tests/kubeapi/test_end_to_end_real.py``).

What it builds, as a user would write it:

- ``gpu_node``: a node KWOK plays, labelled and tainted as the pool's settings expect
  (``gpu-pool=<pool>``, ``workload=inference:NoSchedule``, 8 ``nvidia.com/gpu``) with GPU
  Feature Discovery's labels of an L20;
- ``serving``: the pool's inference Deployment (``app=llm-serving``), one replica a node, which
  the real Deployment and ReplicaSet controllers make and the real scheduler places;
- ``training_job``: an Indexed Job as ``docs/training-jobs.md`` tells users to write one: one
  pod a node (8 GPUs) of the pool, tolerating the lent taint, selecting a GPU by node affinity, a
  ``podFailurePolicy`` that ignores disruptions, a low ``preemptible`` priority and a checkpoint
  time (``rebalancer.test/stop-after``) under its grace period;
- ``budget``: a PodDisruptionBudget over the Job's pods.

What it reads back: ``Api``, the admin's async client (the test's event loop also serves the
fake exporter that Prometheus scrapes, so nothing here blocks it); ``answered``, what
kube-apiserver's own audit log says it answered each of the controller's requests (an
eviction's 201 or 429); ``unschedulable``, the scheduler's own verdict on a pending pod.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp

from tests.support import control_plane, kube
from tests.support.control_plane import STOP_AFTER

Obj = dict[str, Any]

POOL_KEY = "gpu-pool"  # the pool's node selector: ``gpu-pool=<pool>``
INFERENCE_TAINT = {"key": "workload", "value": "inference", "effect": "NoSchedule"}
LENT_TAINT = {"key": "rebalancer.io/lent", "value": "training", "effect": "NoSchedule"}
GPU_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-L20",
    "nvidia.com/gpu.family": "ada",
    "nvidia.com/gpu.memory": "46068",
    "nvidia.com/gpu.count": "8",
}
SERVING = {"app": "llm-serving"}
JOB_NAME = "batch.kubernetes.io/job-name"
INDEX = "batch.kubernetes.io/job-completion-index"
PRIORITY = "preemptible"


def gpu_node(name: str, pool: str) -> Obj:
    """An inference node of ``pool`` (``gpu-pool=<pool>``), played by KWOK."""
    node = control_plane.fake_node(name, {"nvidia.com/gpu": "8"})
    node["metadata"]["labels"].update({POOL_KEY: pool, **GPU_LABELS})
    node["spec"] = {"taints": [dict(INFERENCE_TAINT)]}
    return node


def namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def priority_class() -> Obj:
    """Borrowed training's low priority, which never preempts anything."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": PRIORITY},
        "value": -100,
        "preemptionPolicy": "Never",
    }


def serving(replicas: int, namespace: str, pool: str) -> Obj:
    """The inference Deployment of ``pool``: a replica takes a whole node's GPUs."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm-serving", "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": SERVING},
            "template": {
                "metadata": {"labels": SERVING},
                "spec": {
                    "nodeSelector": {POOL_KEY: pool},
                    "tolerations": [{**INFERENCE_TAINT, "operator": "Equal"}],
                    "containers": [
                        {
                            "name": "server",
                            "image": "vllm/vllm-openai:v0.6.3",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}},
                        }
                    ],
                },
            },
        },
    }


def training_job(
    name: str, namespace: str, pool: str, pods: int, stop_after: str, grace: int
) -> Obj:
    """An Indexed Job of ``pods`` pods of 8 GPUs each on ``pool``'s lent nodes, as a user
    prepares one to borrow nodes: disruptions (an eviction's ``DisruptionTarget``) are not its
    failures."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 6,
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
            },
            "template": {
                "metadata": {"annotations": {STOP_AFTER: stop_after}},
                "spec": {
                    "restartPolicy": "Never",
                    "priorityClassName": PRIORITY,
                    "nodeSelector": {POOL_KEY: pool},
                    "terminationGracePeriodSeconds": grace,
                    "tolerations": [{**LENT_TAINT, "operator": "Equal"}],
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "nvidia.com/gpu.memory",
                                                "operator": "Gt",
                                                "values": ["40000"],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "example.com/train:1",
                            "resources": {
                                "requests": {"nvidia.com/gpu": "8", "cpu": "8", "memory": "64Gi"},
                                "limits": {"nvidia.com/gpu": "8"},
                            },
                        }
                    ],
                },
            },
        },
    }


def indexed_job(
    name: str,
    pods: int,
    gpus: int,
    annotations: Mapping[str, str] | None = None,
    tolerations: Sequence[Obj] = (),
) -> Obj:
    """An Indexed Job of ``pods`` pods of ``gpus`` GPUs each, no retries (``backoffLimit: 0``),
    evictions not its failures: what a test of the control plane itself runs (no pool, no
    priority; ``training_job`` is the borrowing job a user writes)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
            },
            "template": {
                "metadata": {"annotations": dict(annotations or {})},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 30,
                    **({"tolerations": list(tolerations)} if tolerations else {}),
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.com/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def budget(job: str, namespace: str, min_available: int) -> Obj:
    """A budget over the Job's pods. An integer ``minAvailable``: a ``maxUnavailable`` (or a
    percentage) needs the pods' controller to have a scale subresource, which a Job has not."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": job, "namespace": namespace},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {JOB_NAME: job}}},
    }


@dataclass
class Api:
    """The real server as its admin, without blocking the loop: raw paths, decoded answers."""

    url: str
    session: aiohttp.ClientSession

    @staticmethod
    def session_for(server: kube.KubeServer) -> aiohttp.ClientSession:
        trusted = ssl.create_default_context(cafile=str(server.ca))
        return aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {kube.ADMIN_TOKEN}"},
            connector=aiohttp.TCPConnector(ssl=trusted),
        )

    async def ask(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type}
        async with self.session.request(
            method, self.url + path, data=data, headers=headers
        ) as answer:
            return answer.status, await answer.json(content_type=None)

    async def get(self, path: str) -> Any:
        code, doc = await self.ask("GET", path)
        assert code == 200, (path, doc)
        return doc

    async def create(self, path: str, body: Obj) -> Obj:
        code, doc = await self.ask("POST", path, body)
        assert code == 201, (path, doc)
        return dict(doc)

    async def nodes(self) -> dict[str, Obj]:
        listed = await self.get("/api/v1/nodes")
        return {n["metadata"]["name"]: n for n in listed["items"]}

    async def pods(self, namespace: str, selector: str = "") -> list[Obj]:
        listed = await self.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
        return list(listed["items"])

    async def job(self, namespace: str, name: str) -> Obj:
        return dict(await self.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"))

    async def budget(self, namespace: str, name: str) -> Obj:
        path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{name}"
        return dict(await self.get(path))

    async def events(self, namespace: str) -> list[Obj]:
        listed = await self.get(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
        return list(listed["items"])


def conditions(pod: Obj) -> dict[str, Obj]:
    """A pod's (or node's) status conditions by type."""
    return {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}


def running_ready(pod: Obj) -> bool:
    return (
        pod["status"].get("phase") == "Running"
        and conditions(pod).get("Ready", {}).get("status") == "True"
        and "deletionTimestamp" not in pod["metadata"]
    )


def unschedulable(pod: Obj) -> bool:
    """Pending, bound nowhere, and the scheduler's own verdict: it fits no node."""
    scheduled = conditions(pod).get("PodScheduled", {})
    return (
        pod["status"].get("phase") == "Pending"
        and not pod["spec"].get("nodeName")
        and "deletionTimestamp" not in pod["metadata"]
        and (scheduled.get("status"), scheduled.get("reason")) == ("False", "Unschedulable")
    )


def schedulable(node: Obj) -> bool:
    """Ready, and the ``not-ready`` taint taken off by the node lifecycle controller."""
    ready = conditions(node).get("Ready", {}).get("status") == "True"
    taints = {t["key"] for t in node["spec"].get("taints") or ()}
    return ready and "node.kubernetes.io/not-ready" not in taints


@dataclass(frozen=True)
class Answered:
    """One request of the controller's, as kube-apiserver's audit log records it."""

    at: datetime
    verb: str
    resource: str  # with its subresource: ``pods/eviction``
    namespace: str
    name: str
    code: int
    pod: str  # the pod a projected token names (a service account's in a pod); "" otherwise


def answered(server: kube.KubeServer, user: str, since: int = 0) -> list[Answered]:
    """The requests of ``user`` after the audit mark ``since`` that the server answered (not
    watches still streaming), with the code it answered, in the order it answered them."""
    out = []
    log = server.home / "audit.log"
    text = log.read_bytes()[since:] if log.exists() else b""
    for line in text.decode().splitlines():
        event = json.loads(line)
        if event["user"]["username"] != user or event["stage"] != "ResponseComplete":
            continue
        ref: Mapping[str, str] = event.get("objectRef") or {}
        extra = event["user"].get("extra") or {}
        resource = ref.get("resource", "") + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        out.append(
            Answered(
                at=datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")),
                verb=event["verb"],
                resource=resource,
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                code=int(event.get("responseStatus", {}).get("code", 0)),
                pod=next(iter(extra.get("authentication.kubernetes.io/pod-name") or [""])),
            )
        )
    return sorted(out, key=lambda a: a.at)
