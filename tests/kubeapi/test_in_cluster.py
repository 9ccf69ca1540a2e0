"""The controller's own pod on a real node: the chart installed with a real Helm, the image built
here (``tests/support/controller_image.py``) and loaded into the node's containerd, the pod
started by a real kubelet, reading the cluster with its in-cluster configuration (its service
account's projected token, the cluster's CA), holding its Lease, allowed what the chart's RBAC
allows, and seen lending a node of a KWOK pool to a waiting Job and taking it back.

A server of this module's own: the ServiceAccount admission plugin is on (the suite's other
servers run without it, as envtest does), so the pod gets its token as in any cluster. What a
cluster's other components would do and none runs here, the test does, and says so:

- no kube-proxy routes the ``kubernetes`` Service's address to the API server, and the API
  server listens on loopback only: the pod runs in the node's network (the chart's
  ``hostNetwork``) and is told the server's address (``KUBERNETES_SERVICE_HOST`` and ``_PORT``
  in ``extraEnv``, which take precedence over the ones the kubelet derives from the Service);
- no root-CA publisher and no service-account controller run in the controller-manager: the
  test writes each namespace's ``kube-root-ca.crt`` ConfigMap (the server's CA), which the
  projected token volume reads, and its ``default`` ServiceAccount.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support import control_plane, controller_image, helm, kube, realnode
from tests.support.chart import NAMESPACE, RELEASE
from tests.support.deployed import chart_values
from tests.support.exporter import Exporter, serve_exporter
from tests.support.processes import free_port
from tests.support.prometheus import scraping
from tests.support.training_cluster import (
    JOB_NAME,
    Api,
    answered,
    conditions,
    gpu_node,
    namespace,
    priority_class,
    running_ready,
    schedulable,
    serving,
    training_job,
)
from tests.support.waits import counted, until

Obj = dict[str, Any]
POOL = "incluster"
HOSTS_CONTROLLER = "rebalancer.test/controller-node"  # the real node's label
STATE = "rebalancer.io/state"
LOW, HIGH = 5.0, 200.0  # LOW needs the 2 serving nodes; HIGH more than the pool
JOB = "train"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[kube.KubeServer, realnode.RealNode]]:
    """The module's server and control plane, and one real node for the controller."""
    image = controller_image.build()
    home = tmp_path_factory.mktemp("in-cluster")
    (home / "kube").mkdir()
    with (
        kube.running(home / "kube", service_accounts=True) as server,
        control_plane.running(server),
        realnode.running(
            server,
            kube.binaries(),
            home / "node",
            "real-0",
            labels={HOSTS_CONTROLLER: "true"},
            extra_images=[image],
        ) as node,
    ):
        yield server, node


def values(prom: str, server: kube.KubeServer) -> dict[str, Any]:
    """What a platform team would set for this cluster: the pool, the image it loaded, and the
    two things this cluster lacks (see the module's docstring)."""
    given = chart_values(prom, free_port(), POOL, deadline=10)
    repository, tag = controller_image.REF.rsplit(":", 1)
    address = urlsplit(server.url)
    given |= {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "hostNetwork": True,
        "nodeSelector": {HOSTS_CONTROLLER: "true"},
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": address.hostname},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(address.port)},
        ],
        "audit": {"sqlite": {"persistence": {"enabled": False}}},  # no volume provisioner here
    }
    return given


async def test_the_chart_s_pod_lends_and_reclaims_from_inside_the_cluster(
    cluster: tuple[kube.KubeServer, realnode.RealNode], tmp_path: Path
) -> None:
    server, node = cluster
    inference, training = f"{POOL}-serving", f"{POOL}-training"
    nodes_of = [f"{POOL}-{i}" for i in range(3)]
    async with Api.session_for(server) as session:
        api = Api(server.url, session)
        await api.create("/apis/scheduling.k8s.io/v1/priorityclasses", priority_class())
        for name in (NAMESPACE, inference, training):
            await api.create("/api/v1/namespaces", namespace(name))
            # What the service-account controller (not run here) makes in every namespace.
            account = {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "default"},
            }
            await api.create(f"/api/v1/namespaces/{name}/serviceaccounts", account)
        root_ca = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kube-root-ca.crt", "namespace": NAMESPACE},
            "data": {"ca.crt": server.ca.read_text()},
        }
        await api.create(f"/api/v1/namespaces/{NAMESPACE}/configmaps", root_ca)
        for name in nodes_of:
            await api.create("/api/v1/nodes", gpu_node(name, POOL))

        async def nodes_ready() -> bool:
            nodes = await api.nodes()
            return all(n in nodes and schedulable(nodes[n]) for n in [*nodes_of, node.name])

        await until("the nodes Ready", nodes_ready, None, 30)
        await api.create(
            f"/apis/apps/v1/namespaces/{inference}/deployments", serving(2, inference, POOL)
        )

        async def replicas() -> list[Obj]:
            return [p for p in await api.pods(inference) if running_ready(p)]

        await until("the inference replicas running", lambda: counted(replicas, 2), None, 30)
        placed = {
            f"{inference}/{p['metadata']['name']}": p["spec"]["nodeName"] for p in await replicas()
        }
        job = training_job(JOB, training, POOL, 1, "2s", 5)
        await api.create(f"/apis/batch/v1/namespaces/{training}/jobs", job)

        async def lent() -> list[str]:
            nodes = await api.nodes()
            return [n for n in nodes_of if STATE in nodes[n]["metadata"]["labels"]]

        async def job_running() -> list[Obj]:
            pods = await api.pods(training, f"{JOB_NAME}={JOB}")
            return [p for p in pods if running_ready(p)]

        exporter = Exporter(pods=placed, rps=LOW)
        async with (
            serve_exporter(exporter) as target,
            scraping(tmp_path / "prometheus", target) as prom,
        ):
            began = time.monotonic()
            admin = server.kubeconfig(tmp_path / "admin.kubeconfig")
            helm.install(tmp_path / "helm", admin, RELEASE, NAMESPACE, values(prom, server))

            async def controller_ready() -> list[Obj]:
                return [p for p in await api.pods(NAMESPACE) if running_ready(p)]

            try:
                await until(
                    "the controller's pod Ready", lambda: counted(controller_ready, 1), None, 90
                )
            except AssertionError as failed:
                raise AssertionError(f"{failed}\n{await why_not_ready(api, node)}") from None
            ready = time.monotonic() - began
            (pod,) = await controller_ready()
            await until(
                "a node lent, the Job's pod on it", lambda: counted(job_running, 1), None, 60
            )
            lent_nodes = await lent()
            (borrowed,) = await job_running()
            exporter.set_load(HIGH, 0)

            async def back() -> bool:
                return not await lent() and not await job_running()

            await until("the node taken back", back, None, 60)
            lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}"
            lease = (await api.get(lease_path))["spec"]
    name = pod["metadata"]["name"]
    print(f"\nin-cluster: helm install to the pod Ready {ready:.1f}s; lent {lent_nodes}")
    assert pod["spec"]["nodeName"] == node.name
    assert pod["spec"]["hostNetwork"] is True
    assert len(lent_nodes) == 1
    assert borrowed["spec"]["nodeName"] in lent_nodes
    assert lease["holderIdentity"].partition("_")[0] == name  # <pod>_<a uid of the process>
    # Its own token, projected by the kubelet (not the suite's static one): the token names the
    # pod, and every write the loan and its reclaim took was made with it.
    made = [a for a in answered(server, kube.CONTROLLER_USER) if a.pod == name]
    done = {(a.verb, a.resource) for a in made}
    assert ("patch", "nodes") in done, done  # lent and restored
    assert ("create", "pods/eviction") in done, done  # the borrowed pod drained
    assert ("update", "leases") in done, done  # its Lease renewed
    refused = [a for a in made if a.code == 403]
    assert refused == [], refused  # the chart's RBAC allows what it does


async def why_not_ready(api: Api, node: realnode.RealNode) -> str:
    """What the controller's pods and their namespace's Events said, for a failure's reader: a
    pod that never got Ready says whether it was never scheduled, pulled, started or probed."""
    lines = []
    for pod in await api.pods(NAMESPACE):
        name, status = pod["metadata"]["name"], pod.get("status", {})
        lines.append(f"pod {name}: {status.get('phase')} {conditions(pod)}")
        for c in status.get("containerStatuses", []):
            lines.append(f"  {c['name']}: restarts {c.get('restartCount')} {c.get('state')}")
            lines.append(f"  last state: {c.get('lastState')}")
        log = realnode.container_log(node, NAMESPACE, name, "controller")
        tail = log.read_text().splitlines()[-40:] if log else ["(no log file)"]
        lines += ["  log:", *tail]
    for event in await api.events(NAMESPACE):
        lines.append(f"event {event.get('reason')}: {event.get('note')}")
    return "\n".join(lines)
