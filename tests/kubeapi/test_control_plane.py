"""The whole control plane, for real: what the kube-apiserver alone cannot show.

The session's control plane (tests/conftest.py: a server of its own, whose controllers would
fight ``backends.Real``'s stand-ins on the other) with the real kube-scheduler and
kube-controller-manager, and KWOK playing the kubelet of this module's fake GPU node
(``tests/support/control_plane.py``). The Job controller makes an Indexed Job's pods, the
scheduler binds them to the node by its ``nvidia.com/gpu``, and KWOK runs them; an eviction is
allowed or refused by what the disruption controller wrote in the budget's status, and the Job
controller replaces the evicted pod without counting it as a failure (its podFailurePolicy
ignores ``DisruptionTarget``); a deleted pod takes its ``rebalancer.test/stop-after`` to stop, at
most its grace period.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import control_plane, kube
from tests.support.control_plane import STOP_AFTER, ControlPlane, settle
from tests.support.training_cluster import indexed_job, running_ready

Obj = dict[str, Any]
NODE = "kwok-gpu-0"
JOB_NAME = "batch.kubernetes.io/job-name"
INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture(scope="module")
def gpu_node(plane: ControlPlane) -> Iterator[str]:
    """The module's GPU node on the session's control plane (tests/conftest.py), Ready, until
    the module's tests are done."""
    server = plane.server
    node = control_plane.fake_node(NODE, {"nvidia.com/gpu": "8"})
    code, doc = server.request("POST", "/api/v1/nodes", node)
    assert code == 201, doc
    settle("the KWOK node Ready, its not-ready taint taken off", lambda: schedulable(server), 30)
    yield NODE
    server.request("DELETE", f"/api/v1/nodes/{NODE}")


@pytest.fixture
def namespace(plane: ControlPlane, gpu_node: str) -> Iterator[str]:
    """A namespace of the test's own, deleted after it (by the namespace controller)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    code, doc = plane.server.request("POST", "/api/v1/namespaces", body)
    assert code == 201, doc
    yield name
    code, doc = plane.server.request("DELETE", f"/api/v1/namespaces/{name}")
    assert code == 200, doc


def schedulable(server: kube.KubeServer) -> bool:
    node = server.request("GET", f"/api/v1/nodes/{NODE}")[1]
    ready = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}.get("Ready")
    return ready == "True" and not node["spec"].get("taints")


def pods(server: kube.KubeServer, namespace: str, selector: str = "") -> list[Obj]:
    path = f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}"
    code, doc = server.request("GET", path)
    assert code == 200, doc
    return list(doc["items"])


def job_pods_running(server: kube.KubeServer, namespace: str, job: str) -> list[Obj]:
    """The Job's pods that run and are Ready, by completion index."""
    found = [p for p in pods(server, namespace, f"{JOB_NAME}={job}") if running_ready(p)]
    return sorted(found, key=lambda p: p["metadata"]["annotations"][INDEX])


def evict(server: kube.KubeServer, namespace: str, name: str) -> tuple[int, Any]:
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    return server.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)


def pod(server: kube.KubeServer, namespace: str, name: str) -> Obj | None:
    code, doc = server.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert code in (200, 404), doc
    return dict(doc) if code == 200 else None


def job_status(server: kube.KubeServer, namespace: str, name: str) -> Obj:
    code, doc = server.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
    assert code == 200, doc
    return dict(doc.get("status", {}))


def create(server: kube.KubeServer, path: str, body: Obj) -> None:
    code, doc = server.request("POST", path, body)
    assert code == 201, doc


def both_running(server: kube.KubeServer, namespace: str) -> list[Obj]:
    """The Job ``train``'s two pods, once both run and are Ready."""
    what = "both of the Job's pods Running and Ready"
    settle(what, lambda: len(job_pods_running(server, namespace, "train")) == 2, 30)
    return job_pods_running(server, namespace, "train")


def test_the_job_controller_makes_the_pods_the_scheduler_binds_them_and_kwok_runs_them(
    plane: ControlPlane, namespace: str
) -> None:
    server = plane.server
    create(server, f"/apis/batch/v1/namespaces/{namespace}/jobs", indexed_job("train", 2, 1))

    running = both_running(server, namespace)
    assert [p["metadata"]["annotations"][INDEX] for p in running] == ["0", "1"]
    assert {p["spec"]["nodeName"] for p in running} == {NODE}
    for one in running:
        (owner,) = one["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("Job", "train", True)
        scheduled = next(c for c in one["status"]["conditions"] if c["type"] == "PodScheduled")
        assert scheduled["status"] == "True"  # the scheduler's own record of the binding
        assert one["status"]["podIP"].startswith("10.244.")  # KWOK's --cidr
    counted = "the Job controller counting both Ready"
    settle(counted, lambda: job_status(server, namespace, "train").get("ready") == 2, 30)

    # The garbage collector deletes the pods of a Job deleted in the background.
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs/train?propagationPolicy=Background"
    assert server.request("DELETE", path)[0] == 200
    settle("the pods collected", lambda: not pods(server, namespace, f"{JOB_NAME}=train"), 30)


def test_the_real_budget_allows_one_eviction_and_the_job_replaces_the_evicted_pod(
    plane: ControlPlane, namespace: str
) -> None:
    server = plane.server
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "train"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {JOB_NAME: "train"}}},
    }
    create(server, f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", budget)
    job = indexed_job("train", 2, 1, {STOP_AFTER: "4s"})
    create(server, f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
    first, second = both_running(server, namespace)

    def budget_status() -> Obj:
        path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/train"
        return dict(server.request("GET", path)[1].get("status", {}))

    settle(
        "the disruption controller allowing one",
        lambda: budget_status().get("disruptionsAllowed") == 1,
        30,
    )
    assert budget_status()["currentHealthy"] == 2

    evicted = first["metadata"]["name"]
    code, doc = evict(server, namespace, evicted)
    evicted_at = time.monotonic()
    assert code == 201, doc
    code, refused = evict(server, namespace, second["metadata"]["name"])
    assert code == 429, refused  # the eviction itself took the one disruption allowed
    assert refused["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert budget_status()["disruptionsAllowed"] == 0  # until the evicted pod is replaced

    # Checkpointing: still Running, its deletion under way, marked as a disruption.
    stopping = pod(server, namespace, evicted)
    assert stopping is not None
    assert stopping["status"]["phase"] == "Running"
    assert stopping["metadata"]["deletionGracePeriodSeconds"] == 30
    (target,) = [c for c in stopping["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert target["reason"] == "EvictionByEvictionAPI"
    settle("the evicted pod stopped", lambda: pod(server, namespace, evicted) is None, 20)
    took = time.monotonic() - evicted_at
    assert 3.0 <= took <= 8.0, took  # its stop-after, 4 s, to the second

    # The Job controller makes index 0 again once the pod is Failed, after its failure backoff.
    replacement, kept = both_running(server, namespace)
    assert replacement["metadata"]["annotations"][INDEX] == "0"
    assert replacement["metadata"]["uid"] != first["metadata"]["uid"]
    assert kept["metadata"]["uid"] == second["metadata"]["uid"]
    status = job_status(server, namespace, "train")
    assert status.get("failed", 0) == 0, status  # ignored: a disruption, not the job's failure
    assert not [c for c in status.get("conditions", []) if c["type"] == "Failed"], status
    settle(
        "the budget allowing one again", lambda: budget_status().get("disruptionsAllowed") == 1, 30
    )


def test_a_deleted_pod_stops_after_its_annotation_at_most_its_grace_period(
    plane: ControlPlane, namespace: str
) -> None:
    server = plane.server
    cases = {"at-once": None, "checkpoint": "5s", "killed": "60s"}  # grace 30, 30, 2
    for name, stop_after in cases.items():
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "annotations": {} if stop_after is None else {STOP_AFTER: stop_after},
            },
            "spec": {
                "terminationGracePeriodSeconds": 2 if name == "killed" else 30,
                "containers": [{"name": "c", "image": "example.com/c:1"}],
            },
        }
        create(server, f"/api/v1/namespaces/{namespace}/pods", body)
    settle("the pods Running", lambda: sum(map(running_ready, pods(server, namespace))) == 3, 30)

    deleted_at = time.monotonic()
    for name in cases:
        code, doc = server.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        assert code == 200, doc
    took: dict[str, float] = {}
    while len(took) < len(cases):
        assert time.monotonic() - deleted_at < 20, took
        for name in cases:
            if name not in took and pod(server, namespace, name) is None:
                took[name] = time.monotonic() - deleted_at
        time.sleep(0.1)

    # To the second: KWOK counts from deletionTimestamp, which is whole seconds.
    assert took["at-once"] < 2.0, took
    assert 4.0 <= took["checkpoint"] <= 8.0, took
    assert 1.0 <= took["killed"] <= 4.5, took  # its grace period, 2 s, not its 60 s
