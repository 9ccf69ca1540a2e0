"""The controller's adapters against a real kube-apiserver (with etcd, no kubelet), and the
emulator held to the same answers where the controller reads them.

What the controller relies on, asked of Kubernetes itself: RBAC refuses its user until a role
grants it; a node write carrying a stale resourceVersion is a 409; a lend and a reclaim restore a
node's labels and taints byte for byte; the Eviction API evicts a borrowed pod, or answers 429
when a budget allows no disruption; a Lease is held by one candidate at a time; the informer's
list and watch follow the server.

No kubelet runs, so what it would do is done here (``tests/support/kube.py``): pods are bound by
``spec.nodeName`` at creation, a budget's status is written through its ``status`` subresource, and
an evicted pod stays ``Terminating`` until the actuator deletes it with grace 0 past the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import kubeclient
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.leadership import LeaderElector, Timings
from rebalancer.adapters.writer import Conflict, KubeWriter, RetryPolicy
from rebalancer.core import nodestate
from rebalancer.core.outcomes import Outcome, WriteOutcome
from sandbox.emulator import cluster
from sandbox.emulator.resources import NODES
from sandbox.emulator.store import Store
from tests.support import kube
from tests.support.objects import TAINTS
from tests.support.pools import KEYS, RULES, SPEC

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


def scheduling(server: kube.KubeServer, name: str) -> tuple[str, str]:
    """A node's labels and taints as the server holds them, as JSON text."""
    code, doc = server.request("GET", f"/api/v1/nodes/{name}")
    assert code == 200, doc
    return json.dumps(doc["metadata"].get("labels")), json.dumps(doc["spec"].get("taints"))


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


async def test_a_node_write_with_a_stale_resource_version_is_a_conflict(
    real: kube.KubeServer, api: Any
) -> None:
    name = "stale-write"
    assert real.request("POST", "/api/v1/nodes", node_body(name))[0] == 201
    writer = KubeWriter(client.CoreV1Api(api), RetryPolicy(sleep=no_sleep))
    seen = await writer.get_node(name)
    # Another writer changes the node after it was read.
    code, _ = real.request(
        "PATCH",
        f"/api/v1/nodes/{name}",
        {"metadata": {"labels": {"other": "writer"}}},
        content_type="application/merge-patch+json",
    )
    assert code == 200
    change = nodestate.NodeChange(None, {"example.com/touched": "yes"}, {})
    with pytest.raises(Conflict) as raised:
        await writer.patch_node(name, change, seen["metadata"]["resourceVersion"])
    assert raised.value.code == 409
    assert "other" in json.loads(scheduling(real, name)[0])
    assert "example.com/touched" not in json.loads(scheduling(real, name)[0])


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


async def test_a_lend_and_a_reclaim_give_a_real_node_back_byte_for_byte(
    real: kube.KubeServer, api: Any
) -> None:
    name = "lend-and-back"
    assert real.request("POST", "/api/v1/nodes", node_body(name))[0] == 201
    before = scheduling(real, name)
    actuator = Actuator(
        KubeWriter(client.CoreV1Api(api), RetryPolicy(sleep=no_sleep)),
        KEYS,
        SPEC,
        RULES,
        lambda: datetime.now(UTC),
    )
    lent = await actuator.lend(name, "real-lend")
    assert lent.outcome is Outcome.APPLIED, lent.message
    labels, taints = (json.loads(t) for t in scheduling(real, name))
    assert labels[KEYS.state] == "lent"
    assert {"key": KEYS.lent_taint, "value": "training", "effect": "NoSchedule"} in taints
    assert not any(t["key"] == "workload" for t in taints)
    pod = borrowed_pod(real, name, "real-job")
    # The deadline is ahead: the borrowed pod is evicted through the Eviction API and, with no
    # kubelet to stop it, stays terminating.
    deadline = datetime.now(UTC) + timedelta(seconds=3)
    reclaiming = await actuator.reclaim(name, "real-reclaim", deadline)
    assert reclaiming.outcome is Outcome.IN_PROGRESS, reclaiming.message
    assert [w.outcome for w in reclaiming.writes if w.kind == "evict"] == [WriteOutcome.EVICTED]
    pod_path = f"/api/v1/namespaces/{TRAINING}/pods/{pod['metadata']['name']}"
    code, terminating = real.request("GET", pod_path)
    assert code == 200
    assert terminating["metadata"].get("deletionTimestamp"), terminating["metadata"]
    # The serving taints are back at once (the reclaim's first write); the node is still
    # reclaiming while a borrowed pod is on it.
    assert scheduling(real, name)[1] == before[1]
    assert json.loads(scheduling(real, name)[0])[KEYS.state] == "reclaiming"
    # Past the deadline, the borrowed pod is deleted with grace 0 and the node serves again.
    await asyncio.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + 0.5)
    done = await actuator.progress(name)
    assert done.outcome is Outcome.APPLIED, done.message
    assert [w.kind for w in done.writes] == ["delete", "finish"]
    assert real.request("GET", pod_path)[0] == 404
    assert scheduling(real, name) == before


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


async def test_a_lease_is_held_by_one_candidate_at_a_time(api: Any) -> None:
    timings = Timings(lease_duration=15.0, renew_deadline=10.0, retry_period=2.0)

    def candidate(identity: str) -> LeaderElector:
        return LeaderElector(
            api, name="real-lease", namespace="default", identity=identity, timings=timings
        )

    a, b = candidate("replica-a"), candidate("replica-b")
    assert await a.step()
    assert not await b.step()
    assert a.term is not None
    assert b.term is None
    assert await a.release()
    assert await b.step()


async def test_the_informer_lists_then_watches_the_real_server(
    real: kube.KubeServer, api: Any
) -> None:
    informer = Informer(api)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        name = "watched"
        assert real.request("POST", "/api/v1/nodes", node_body(name))[0] == 201
        borrowed_pod(real, name, "watched-job")

        def seen() -> list[str]:
            view = next((v for v in informer.node_views(RULES) if v.name == name), None)
            return [] if view is None else [p.name for p in view.pods]

        async with asyncio.timeout(30):
            while seen() != ["watched-job-0"]:
                await asyncio.sleep(0.05)
        # A change made after the list arrives through the watch.
        merge = "application/merge-patch+json"
        patch = {"metadata": {"labels": {"example.com/rack": "r2"}}}
        assert real.request("PATCH", f"/api/v1/nodes/{name}", patch, content_type=merge)[0] == 200
        async with asyncio.timeout(30):
            while True:
                view = next(v for v in informer.node_views(RULES) if v.name == name)
                if view.labels.get("example.com/rack") == "r2":
                    break
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
