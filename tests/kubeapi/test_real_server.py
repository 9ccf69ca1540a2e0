"""What only the real kube-apiserver can say, and two answers the emulator is held to.

The pinned release is the one running; RBAC refuses the controller's user until a role grants
it; a stale resourceVersion and a budget that allows no disruption get the same ``Status`` (409,
429) from both servers, and the writer reads the 429 as a blocked eviction. Everything else the
controller does runs on the real server as the same tests as on the emulator (the ``backend``
parameter, ``tests/support/backends.py``), and ``test_conformance.py`` compares raw answers.

No kubelet runs: a pod is bound by ``spec.nodeName`` at creation, its Running status and a
budget's status are written through their ``status`` subresources, as those components would.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import kubeclient
from rebalancer.adapters.writer import KubeWriter, RetryPolicy
from rebalancer.core.outcomes import WriteOutcome
from sandbox.emulator import cluster
from sandbox.emulator.resources import NODES
from sandbox.emulator.store import Store
from tests.support import kube
from tests.support.objects import TAINTS

Obj = dict[str, Any]
TRAINING = cluster.TRAINING_NAMESPACE


async def no_sleep(_: float) -> None:
    """Retry backoff without waiting."""


def node_body(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"gpu-pool": "inference", "example.com/rack": "r1"}},
        "spec": {"taints": copy.deepcopy(TAINTS)},
    }


def ensure_namespace(server: kube.KubeServer, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    code, doc = server.request("POST", "/api/v1/namespaces", body)
    assert code in (201, 409), doc


def borrowed_pod(server: kube.KubeServer, node: str, job: str) -> Obj:
    """A training pod bound to ``node`` (no scheduler runs: bound at creation)."""
    ensure_namespace(server, TRAINING)
    pod = cluster.training_pod(job, 0, gpus=1, priority_class=None)
    pod["spec"]["nodeName"] = node
    code, doc = server.request("POST", f"/api/v1/namespaces/{TRAINING}/pods", pod)
    assert code == 201, doc
    return dict(doc)


@pytest.fixture
async def api(real: kube.KubeServer, tmp_path: Path) -> AsyncIterator[Any]:
    """The product's own client, as ``rebalancer run`` opens it, on the admin's kubeconfig."""
    async with kubeclient.api_client(real.kubeconfig(tmp_path / "kubeconfig")) as opened:
        yield opened


def test_the_server_is_the_pinned_release(real: kube.KubeServer) -> None:
    assert real.version.startswith("v1.36."), real.version


def test_rbac_refuses_the_controller_s_user_until_a_role_grants_it(real: kube.KubeServer) -> None:
    code, status = real.request("GET", "/api/v1/nodes", token=kube.CONTROLLER_TOKEN)
    assert code == 403
    assert status["reason"] == "Forbidden"
    assert status["message"] == (
        f'nodes is forbidden: User "{kube.CONTROLLER_USER}" cannot list resource "nodes" in '
        'API group "" at the cluster scope'
    )


async def test_a_stale_resource_version_gets_the_same_status_from_both_servers(
    real: kube.KubeServer,
) -> None:
    name = "stale-status"
    assert real.request("POST", "/api/v1/nodes", node_body(name))[0] == 201
    stale = {"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}}
    merge = "application/merge-patch+json"
    path = f"/api/v1/nodes/{name}"
    code, real_status = real.request("PATCH", path, stale, content_type=merge)
    store = Store()
    store.create(NODES, None, node_body(name))
    ((emulated_code, emulated_status),) = await kube.ask_emulator(
        store, [("PATCH", path, stale, merge)]
    )
    assert (code, emulated_code) == (409, 409)
    for key in ("kind", "status", "reason", "code", "message", "details"):
        assert emulated_status.get(key) == real_status.get(key), key


async def _blocked_eviction(api: Any, namespace: str, pod: str, uid: str) -> WriteOutcome:
    writer = KubeWriter(client.CoreV1Api(api), RetryPolicy(sleep=no_sleep))
    return await writer.evict(namespace, pod, uid)


RUNNING = {
    "phase": "Running",
    "conditions": [{"type": "Ready", "status": "True"}],
}


def set_running(server: kube.KubeServer, pod: Obj) -> None:
    """What the kubelet would report once the pod runs (no kubelet here): Running and Ready.
    A pod still Pending is evicted without consulting any budget."""
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
    merge = "application/merge-patch+json"
    code, doc = server.request("PATCH", path, {"status": RUNNING}, content_type=merge)
    assert code == 200, doc


def budget_allowing_nothing(job: str) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": job, "namespace": TRAINING},
        "spec": {"selector": {"matchLabels": {"job-name": job}}, "minAvailable": 1},
    }


async def test_a_budget_that_allows_no_disruption_answers_429_and_the_emulator_says_the_same(
    real: kube.KubeServer, api: Any
) -> None:
    name, job = "budgeted", "budgeted-job"
    assert real.request("POST", "/api/v1/nodes", node_body(name))[0] == 201
    pod = borrowed_pod(real, name, job)
    set_running(real, pod)
    base = f"/apis/policy/v1/namespaces/{TRAINING}/poddisruptionbudgets"
    code, made = real.request("POST", base, budget_allowing_nothing(job))
    assert code == 201, made
    # What the disruption controller would write: the budget's status, with none allowed.
    status = {
        "observedGeneration": made["metadata"]["generation"],
        "disruptionsAllowed": 0,
        "currentHealthy": 1,
        "desiredHealthy": 1,
        "expectedPods": 1,
    }
    code, doc = real.request("PUT", f"{base}/{job}/status", {**made, "status": status})
    assert code == 200, doc
    meta = pod["metadata"]
    assert await _blocked_eviction(api, TRAINING, meta["name"], meta["uid"]) is WriteOutcome.BLOCKED
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta["name"], "namespace": TRAINING},
    }
    path = f"/api/v1/namespaces/{TRAINING}/pods/{meta['name']}/eviction"
    code, real_answer = real.request("POST", path, eviction)
    assert code == 429
    # The emulator, asked the same, answers the same.
    store = Store()
    cluster.seed(store)
    emulated = cluster.training_pod(job, 0, gpus=1, priority_class=None)
    emulated["spec"]["nodeName"] = "inference-3"
    emulated["status"] = RUNNING
    cluster.add(store, emulated)
    cluster.add(store, {**budget_allowing_nothing(job), "status": status})
    ((emulated_code, emulated_answer),) = await kube.ask_emulator(
        store, [("POST", path, eviction, "application/json")]
    )
    assert emulated_code == code
    for key in ("reason", "code", "message"):
        assert emulated_answer[key] == real_answer[key], (key, emulated_answer, real_answer)
