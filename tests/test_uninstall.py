"""``helm uninstall`` leaves every node as it was: the chart's pre-delete hook, on a real
kube-apiserver.

The controller runs as the chart deploys it (the end-to-end scenario: tests/support/scenario.py)
until it has lent the idle nodes and training runs on them. Then what Helm does at uninstall
is done in its order: the hook's Role and RoleBinding created, then its Job's container run as a
local process with the controller's account. The cluster has no controller-manager here, so the
test plays the ReplicaSet controller and the kubelet for the controller's one pod: once the
Deployment is scaled to 0, the controller process gets SIGTERM and its Pod object is deleted.

Proven: the hook scaled the controller down before it took anything back (no intent of the hook
precedes the controller's exit), every lent node's taints and labels are the originals byte
for byte, the borrowed pods are gone, the hook's audit records are JSON lines in its log (origin
operator), and the API server refused none of the hook's requests.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

from rebalancer.core.audit import Kind
from sandbox.emulator import cluster
from sandbox.emulator.resources import PODS
from sandbox.emulator.store import DeleteOptions
from tests.support import kube
from tests.support.backends import Real
from tests.support.chart import NAMESPACE, render
from tests.support.exporter import Exporter, serve_exporter
from tests.support.pools import IDLE, INFERENCE, REPLICAS, STATE
from tests.support.processes import as_pod, free_port, probe, start_pod
from tests.support.prometheus import scraping
from tests.support.rbac import apply_to, service_account_of
from tests.support.reads import scheduling
from tests.support.scenario import LOW_RPS, POD_NAME, chart_values, on_real
from tests.support.waits import stop, until


async def test_uninstall_stops_the_controller_then_gives_every_node_back(
    real: kube.KubeServer, tmp_path: Path
) -> None:
    exporter = Exporter(pods=REPLICAS, rps=LOW_RPS)
    docs = render({})
    async with (
        serve_exporter(exporter) as target,
        scraping(tmp_path / "prometheus", target) as prom,
        on_real(Real(real, tmp_path), docs, tmp_path) as box,
    ):
        originals = {name: scheduling(n) for name, n in (await box.nodes()).items()}
        values = chart_values(prom, free_port())
        installed = render(values)
        hook = render(values, hook="pre-delete")
        (deployment,) = [d for d in installed if d["kind"] == "Deployment"]
        name = deployment["metadata"]["name"]
        deployments = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
        code, made = real.request("POST", deployments, deployment)
        assert code == 201, made
        try:
            await _scenario(box, real, installed, hook, deployment, originals, tmp_path)
        finally:
            real.request("DELETE", f"{deployments}/{name}")


async def _scenario(
    box: Any,
    real: kube.KubeServer,
    installed: list[dict[str, Any]],
    hook: list[dict[str, Any]],
    deployment: dict[str, Any],
    originals: dict[str, Any],
    tmp_path: Path,
) -> None:
    name = deployment["metadata"]["name"]
    template = deployment["spec"]["template"]
    # The controller's pod, as the ReplicaSet would have made it (the process below is its
    # container): what the hook waits to see gone.
    controller_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD_NAME,
            "namespace": NAMESPACE,
            "labels": template["metadata"]["labels"],
        },
        "spec": {"containers": [{"name": "controller", "image": "rebalancer"}]},
    }
    objects = box.objects
    objects.create(PODS, NAMESPACE, controller_pod)
    pod = as_pod(installed, tmp_path / "pod", name=POD_NAME, namespace=NAMESPACE)
    proc = await start_pod(pod, box.kubeconfig)
    stopped_at: list[float] = []

    async def replica_set() -> None:
        """Scale to 0 -> SIGTERM the container, then the pod object goes."""
        while True:
            _, now = real.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}")
            if now["spec"].get("replicas") == 0:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
                stopped_at.append(time.time())
                objects.delete(PODS, NAMESPACE, POD_NAME, DeleteOptions(grace_period=0))
                return
            await asyncio.sleep(0.2)

    rs = asyncio.create_task(replica_set())
    try:
        base = f"http://127.0.0.1:{pod.port}"
        await until(
            "the readiness probe", lambda: probe(box.session, base + pod.readiness), proc, 20
        )

        async def idle_lent_and_used() -> bool:
            nodes = await box.nodes()
            states = {nodes[n]["metadata"]["labels"].get(STATE) for n in IDLE}
            borrowed = {
                p["spec"].get("nodeName")
                for p in await box.pods()
                if p["metadata"]["namespace"] == cluster.TRAINING_NAMESPACE
                and p["status"].get("phase") == "Running"
            }
            return states == {"lent"} and set(IDLE) <= borrowed

        await until("lending the idle nodes", idle_lent_and_used, proc, within=25)

        # helm uninstall: the hook's Role and RoleBinding, then its Job.
        mark = real.audit_mark()
        apply_to(objects, hook, user=service_account_of(installed))
        job = as_pod(
            [*installed, *hook],
            tmp_path / "hook",
            name="uninstall-x",
            namespace=NAMESPACE,
            kind="Job",
        )
        uninstall = await start_pod(job, box.kubeconfig)
        async with asyncio.timeout(60):
            out, err = await uninstall.communicate()
        assert uninstall.returncode == 0, err.decode()[-3000:]
        await asyncio.wait_for(rs, 5)
    finally:
        await stop(rs)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    lines = out.decode().splitlines()
    assert lines[0].startswith(f"deployment/{name} scaled to 0; its 1 pod(s) gone in "), lines[0]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    intents = [r for r in records if r["kind"] == Kind.INTENT.value]
    assert sorted(r["node"] for r in intents) == sorted(IDLE)
    assert {r["origin"] for r in intents} == {"operator"}
    # Nothing was taken back while the controller could still lend.
    (stopped,) = stopped_at
    assert all(_epoch(r["time"]) >= stopped - 1.0 for r in intents), (stopped, intents)

    nodes = await box.nodes()
    for node in INFERENCE:
        assert scheduling(nodes[node]) == originals[node], node
    left = [
        p
        for p in await box.pods()
        if p["spec"].get("nodeName") in INFERENCE
        and p["metadata"]["namespace"] == cluster.TRAINING_NAMESPACE
    ]
    assert left == [], "the borrowed pods are gone"
    refused = [d for d in real.decisions(kube.CONTROLLER_USER, mark) if not d.allowed]
    assert refused == [], refused


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
