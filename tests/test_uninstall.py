"""``helm uninstall`` leaves every node as it was: the chart's pre-delete hook, on the session's
real control plane (tests/conftest.py).

The pool of ``harness.on_plane`` (8 KWOK GPU nodes, two inference replicas, training as six
one-pod Jobs waiting for lent nodes) and one untainted KWOK node for the controller's own pod.
The chart's Deployment is created as Helm creates it: the real Deployment and ReplicaSet
controllers make its pod, the scheduler binds it to that node and KWOK runs it; its container is
a local process (the rendered container, as the chart's service account, named after the pod
the ReplicaSet made). Once the controller has lent the idle nodes and training runs on them,
what Helm does at uninstall is done in its order: the hook's Role and RoleBinding created, then
its Job's container run as a local process with the controller's account. The hook scales the
Deployment to 0; the ReplicaSet controller deletes the pod; the test, as the kubelet, sends the
container SIGTERM when the pod's deletion begins, and KWOK ends the pod after its
``rebalancer.test/stop-after`` (5 s, the container's shutdown within it).

Proven: the hook scaled the controller down before it took anything back (no intent of the hook
precedes the controller's exit), every lent node's taints and labels are the originals byte for
byte, the borrowed pods are gone from them, the hook's audit records are JSON lines in its log
(origin operator), and the API server refused none of the hook's requests.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rebalancer.core.audit import Kind
from sandbox.emulator import cluster
from sandbox.emulator.clock import ManualClock
from tests.support import control_plane, kube
from tests.support.backends import RealCluster
from tests.support.chart import NAMESPACE, RELEASE, render
from tests.support.control_plane import STOP_AFTER, ControlPlane
from tests.support.harness import IDLE, INFERENCE, STATE, Harness, on_plane
from tests.support.processes import as_pod, free_port, probe, start_pod
from tests.support.rbac import apply_to, service_account_of
from tests.support.reads import scheduling
from tests.support.scenario import chart_values
from tests.support.training_cluster import running_ready
from tests.support.waits import stop, until

SYSTEM_NODE = "system-0"  # where the controller's own pod runs: no GPU, no taint
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}"


async def test_uninstall_stops_the_controller_then_gives_every_node_back(
    plane: ControlPlane, tmp_path: Path
) -> None:
    server = plane.server
    code, doc = server.request("POST", "/api/v1/nodes", control_plane.fake_node(SYSTEM_NODE, {}))
    assert code == 201, doc
    hook_roles: list[dict[str, Any]] = []
    try:
        async with on_plane(plane, tmp_path) as h:
            originals = {name: scheduling(n) for name, n in (await h.nodes()).items()}
            values = chart_values(h.prometheus.url, free_port())
            values["podAnnotations"] = {STOP_AFTER: "5s"}  # the container's shutdown fits in it
            # The plane has no storage provisioner: the audit file in an emptyDir, not a claim.
            values["audit"] = {"sqlite": {"persistence": {"enabled": False}}}
            installed = render(values)
            hook = render(values, hook="pre-delete")
            (deployment,) = [d for d in installed if d["kind"] == "Deployment"]
            code, made = server.request("POST", DEPLOYMENTS, deployment)
            assert code == 201, made
            try:
                await _scenario(h, server, installed, hook, hook_roles, originals, tmp_path)
            finally:
                name = deployment["metadata"]["name"]
                server.request("DELETE", f"{DEPLOYMENTS}/{name}?propagationPolicy=Foreground")
    finally:
        for role in hook_roles:  # the plane is the session's: a later install finds none
            kind = role["kind"].lower() + "s"
            meta = role["metadata"]
            path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{meta['namespace']}/{kind}"
            server.request("DELETE", f"{path}/{meta['name']}")
        server.request("DELETE", LEASE)
        server.request("DELETE", f"/api/v1/nodes/{SYSTEM_NODE}")


async def _scenario(
    h: Harness,
    server: kube.KubeServer,
    installed: list[dict[str, Any]],
    hook: list[dict[str, Any]],
    hook_roles: list[dict[str, Any]],
    originals: dict[str, Any],
    tmp_path: Path,
) -> None:
    selector = ",".join(f"{k}={v}" for k, v in _pod_labels(installed).items())
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}"

    async def controller_pods() -> list[dict[str, Any]]:
        return list((await h.get(pods_path))["items"])

    async def one_running() -> bool:
        return [running_ready(p) for p in await controller_pods()] == [True]

    await until("the controller's pod running on its node", one_running, None, 30)
    (made,) = await controller_pods()
    assert made["spec"]["nodeName"] == SYSTEM_NODE, made["spec"]
    pod_name = made["metadata"]["name"]
    pod = as_pod(installed, tmp_path / "pod", name=pod_name, namespace=NAMESPACE)
    kubeconfig = server.kubeconfig(tmp_path / "controller.kubeconfig", kube.CONTROLLER_TOKEN)
    proc = await start_pod(pod, kubeconfig)
    stopped_at: list[float] = []

    async def kubelet() -> None:
        """The pod's deletion begins (the ReplicaSet scaled to 0) -> SIGTERM the container."""
        path = f"{h.url}/api/v1/namespaces/{NAMESPACE}/pods/{pod_name}"
        while True:  # on the loop, not blocking it: the exporter Prometheus scrapes runs here
            async with h.session.get(path) as answer:
                code, now = answer.status, await answer.json()
            if code == 404 or "deletionTimestamp" in now["metadata"]:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
                stopped_at.append(time.time())
                return
            await asyncio.sleep(0.2)

    watching = asyncio.create_task(kubelet())
    try:
        base = f"http://127.0.0.1:{pod.health_port}"
        await until("the readiness probe", lambda: probe(h.session, base + pod.readiness), proc, 20)

        async def idle_lent_and_used() -> bool:
            nodes = await h.nodes()
            states = {nodes[n]["metadata"]["labels"].get(STATE) for n in IDLE}
            borrowed = {
                p["spec"].get("nodeName")
                for p in await h.pods()
                if p["metadata"]["namespace"] == cluster.TRAINING_NAMESPACE and running_ready(p)
            }
            return states == {"lent"} and set(IDLE) <= borrowed

        await until("lending the idle nodes", idle_lent_and_used, proc, within=30)

        # helm uninstall: the hook's Role and RoleBinding, then its Job.
        mark = server.audit_mark()
        admin = RealCluster(server, ManualClock(datetime.now(UTC)))
        hook_roles.extend(apply_to(admin, hook, user=service_account_of(installed)))
        job = as_pod(
            [*installed, *hook],
            tmp_path / "hook",
            name="uninstall-x",
            namespace=NAMESPACE,
            kind="Job",
        )
        uninstall = await start_pod(job, kubeconfig)
        async with asyncio.timeout(90):
            out, err = await uninstall.communicate()
        assert uninstall.returncode == 0, err.decode()[-3000:]
        await asyncio.wait_for(watching, 5)
    finally:
        await stop(watching)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    _, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()[-3000:]

    lines = out.decode().splitlines()
    name = _deployment_name(installed)
    assert lines[0].startswith(f"deployment/{name} scaled to 0; its 1 pod(s) gone in "), lines[0]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    intents = [r for r in records if r["kind"] == Kind.INTENT.value]
    assert sorted(r["node"] for r in intents) == sorted(IDLE)
    assert {r["origin"] for r in intents} == {"operator"}
    # Nothing was taken back while the controller could still lend.
    (stopped,) = stopped_at
    assert all(_epoch(r["time"]) >= stopped - 1.0 for r in intents), (stopped, intents)

    nodes = await h.nodes()
    for node in INFERENCE:
        assert scheduling(nodes[node]) == originals[node], node

    # The hook's reclaim is done once the borrowed pods have stopped (or, past the deadline,
    # been deleted); their objects go a moment later, once KWOK and the Job controller (its
    # finalizer) are done with them.
    async def borrowed_gone() -> bool:
        return not [
            p
            for p in await h.pods()
            if p["spec"].get("nodeName") in INFERENCE
            and p["metadata"]["namespace"] == cluster.TRAINING_NAMESPACE
        ]

    await until("the borrowed pods gone from the inference nodes", borrowed_gone, None, 30)
    refused = [d for d in server.decisions(kube.CONTROLLER_USER, mark) if not d.allowed]
    assert refused == [], refused


def _deployment_name(docs: list[dict[str, Any]]) -> str:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return str(deployment["metadata"]["name"])


def _pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return dict(deployment["spec"]["selector"]["matchLabels"])


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
