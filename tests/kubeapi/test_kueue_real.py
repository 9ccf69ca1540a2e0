"""Kueue v0.17.0 itself, with the real control plane: a Job queued by Kueue is a taker while
its Workload waits, its pods are takers once admitted, the controller's actuator lends the
node they need and the real scheduler runs them there; a reclaim evicts them, and what Kueue
does then depends on ``waitForPodsReady`` (docs/design/takers.md#running-kueue-here).

Kueue's manager is built from its module by ``tests/kube/build.sh`` and run as the admin by
``kueue.running``, without its admission webhooks (the Job is created suspended, as Kueue's
defaulting webhook would make it) and without its visibility server. The pool's lent label
is what Kueue's ResourceFlavor selects, so an admitted Job's pods wait for a lent node.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer import settings as settings_mod
from rebalancer.adapters import kubeclient
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import Backoff, WatchSettings
from rebalancer.adapters.writer import KubeWriter
from rebalancer.core.outcomes import Outcome
from rebalancer.runtime import wiring
from tests.support import control_plane, kube, kueue
from tests.support.control_plane import STOP_AFTER, settle
from tests.support.training_cluster import INFERENCE_TAINT, LENT_TAINT, indexed_job

Obj = dict[str, Any]
NODE = "kwok-gpu-0"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
LENT_LABEL = {"gpu-lent": "true"}
# The API server reaches a webhook at its Service's endpoint, not at a cluster IP: no kube-proxy
# runs here (one test registers Kueue's webhooks).
ROUTING = ["--enable-aggregator-routing=true"]
SETTINGS = """
takers: {kueue_workloads: true}
pools:
  - name: inference
    node_selector: {gpu-pool: inference}
    lent_labels: {gpu-lent: "true"}
    rps_per_node: 100
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube.KubeServer]:
    """A control plane of the module's own with one KWOK GPU node, inference's for now."""
    with (
        kube.running(tmp_path_factory.mktemp("kueue-real"), flags=ROUTING) as started,
        control_plane.running(started),
    ):
        node = control_plane.fake_node(NODE, {"nvidia.com/gpu": "8"})
        node["metadata"]["labels"]["gpu-pool"] = "inference"
        node["spec"] = {"taints": [dict(INFERENCE_TAINT)]}
        ask(started, "POST", "/api/v1/nodes", node)
        flavor = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "lent"},
            "spec": {"nodeLabels": LENT_LABEL},
        }
        for doc in kueue.crds():  # the flavor's CRD before Kueue starts (each test's own)
            code, answer = started.request(
                "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc
            )
            assert code in (201, 409), answer
        settle("Kueue's CRDs served", lambda: served(started, "resourceflavors"), 60)
        ask(started, "POST", f"{KUEUE}/resourceflavors", flavor)
        yield started


def served(server: kube.KubeServer, plural: str) -> bool:
    return server.request("GET", f"{KUEUE}/{plural}?limit=1")[0] == 200


def ask(server: kube.KubeServer, method: str, path: str, body: Obj | None = None) -> Obj:
    content = "application/merge-patch+json" if method == "PATCH" else "application/json"
    code, doc = server.request(method, path, body, content_type=content)
    assert code in (200, 201), (method, path, doc)
    return dict(doc)


def queues(server: kube.KubeServer, ns: str) -> str:
    """A namespace with a LocalQueue of a held ClusterQueue of its own (8 GPUs of lent nodes);
    the ClusterQueue's name."""
    ask(server, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    cluster_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": ns},
        "spec": {
            "namespaceSelector": {},
            "stopPolicy": "Hold",  # nothing is admitted until the test lets it
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "lent",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}],
                        }
                    ],
                }
            ],
        },
    }
    ask(server, "POST", f"{KUEUE}/clusterqueues", cluster_queue)
    local = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "user-queue", "namespace": ns},
        "spec": {"clusterQueue": ns},
    }
    ask(server, "POST", f"{KUEUE}/namespaces/{ns}/localqueues", local)
    return ns


def queued_job(name: str, suspend: bool = True) -> Obj:
    """Two pods of 4 GPUs, tolerating the lent taint, queued to Kueue and suspended (as its
    webhook would set it, where it is not called); evictions are not its failures."""
    job = indexed_job(name, 2, 4, {STOP_AFTER: "1s"}, [{"operator": "Equal", **LENT_TAINT}])
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
    job["spec"]["suspend"] = suspend
    return job


@dataclass
class Cluster:
    server: kube.KubeServer
    ns: str
    informer: Informer
    actuator: Actuator
    marks: Any
    began: float

    def workloads(self) -> list[Obj]:
        return list(ask(self.server, "GET", f"{KUEUE}/namespaces/{self.ns}/workloads")["items"])

    def workload(self) -> Obj:
        (only,) = self.workloads()
        return only

    def pods(self) -> list[Obj]:
        return list(ask(self.server, "GET", f"/api/v1/namespaces/{self.ns}/pods")["items"])

    def job(self) -> Obj:
        return ask(self.server, "GET", f"/apis/batch/v1/namespaces/{self.ns}/jobs/llama")

    def takers(self) -> list[tuple[str, str | None]]:
        return [
            (p.name, p.job) for p in self.informer.pending(self.marks) if p.namespace == self.ns
        ]

    async def until(self, what: str, check: Callable[[], object], within: float = 90) -> float:
        began = time.monotonic()
        while not check():
            if time.monotonic() - began > within:
                raise AssertionError(f"not within {within} s: {what}")
            await asyncio.sleep(0.1)
        return time.monotonic() - began


async def evictions_begin(c: Cluster, deadline: datetime) -> None:
    """The reclaim's first pass evicts the Job's two running pods. It is in progress while they
    end, or applied at once when KWOK deleted them before the pass looked again (a loaded
    machine's timing): either way, it met both pods running."""
    result = await c.actuator.reclaim(NODE, "reclaim", deadline)
    assert result.outcome in (Outcome.IN_PROGRESS, Outcome.APPLIED), result
    assert result.notice is not None, result
    assert result.notice.pods == 2, result


async def reclaimed(c: Cluster) -> None:
    """The reclaim finished: asked again until its pods are gone and the node serves."""
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    for _ in range(300):
        if (await c.actuator.reclaim(NODE, "reclaim", deadline)).outcome is Outcome.APPLIED:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{NODE} not reclaimed within a minute")


def conditions(workload: Obj) -> dict[str, str]:
    found = (workload.get("status") or {}).get("conditions") or ()
    return {c["type"]: f"{c['status']}/{c.get('reason', '')}" for c in found}


def running_on(pods: list[Obj], node: str) -> bool:
    return len(pods) == 2 and all(
        p["spec"].get("nodeName") == node and p["status"].get("phase") == "Running" for p in pods
    )


@contextlib.asynccontextmanager
async def kueue_and_controller(
    server: kube.KubeServer, home: Path, config: Obj | None = None, webhooks: str | None = None
) -> AsyncIterator[Cluster]:
    """Kueue (``config`` over the test default; its webhooks registered at ``webhooks``, an
    address of this machine, if given), a namespace and queues of the test's own, the
    controller's informer (watching Workloads) and actuator, as the admin."""
    path = home / "rebalancer.yaml"
    path.write_text(SETTINGS, encoding="utf-8")
    settings = settings_mod.load(path, env={})
    (pool,) = wiring.pool_configs(settings)
    ns = queues(server, f"t-{uuid.uuid4().hex[:8]}")
    with kueue.running(server, home / "kueue", config, webhooks=webhooks):
        async with kubeclient.api_client(server.kubeconfig(home / "kubeconfig")) as api:
            fast = WatchSettings(backoff=Backoff(initial=0.05, maximum=0.2))
            informer = Informer(api, settings=fast, watch_pending=True, watch_workloads=True)
            writer = KubeWriter(client.CoreV1Api(api))
            actuator = Actuator(
                writer, settings.keys(), pool.lend_spec, pool.marks, wiring.utc_now, False
            )
            task = asyncio.create_task(informer.run())
            try:
                await asyncio.wait_for(informer.synced.wait(), 30)
                yield Cluster(server, ns, informer, actuator, pool.marks, time.monotonic())
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                ask(
                    server,
                    "DELETE",
                    f"/apis/batch/v1/namespaces/{ns}/jobs/llama?propagationPolicy=Background",
                )


async def admitted_and_running(c: Cluster, suspend: bool = True) -> dict[str, float]:
    """The Job queued (``suspend`` as given), its Workload waiting (a taker), admitted, its pods
    takers, the node lent for them and the pods running there; the seconds each step took."""
    took = {}
    made = ask(
        c.server, "POST", f"/apis/batch/v1/namespaces/{c.ns}/jobs", queued_job("llama", suspend)
    )
    assert made["spec"]["suspend"] is True  # as sent, or as Kueue's webhook made it
    took["workload made"] = await c.until("Kueue makes a Workload", c.workloads)
    workload = c.workload()
    name = workload["metadata"]["name"]
    assert "admission" not in workload.get("status", {})
    job = f"{c.ns}/{name}"
    took["workload a taker"] = await c.until(
        "the Workload's pods are takers",
        lambda: c.takers() == [(f"{name}/main-0", job), (f"{name}/main-1", job)],
    )
    assert [p.requests.gpu for p in c.informer.pending(c.marks)] == [4, 4]

    ask(c.server, "PATCH", f"{KUEUE}/clusterqueues/{c.ns}", {"spec": {"stopPolicy": "None"}})
    took["admitted"] = await c.until(
        "Kueue admits it", lambda: "admission" in c.workload().get("status", {})
    )
    took["pods takers"] = await c.until(
        "the Job's pending pods are the takers, the Workload no more",
        lambda: [j for _, j in c.takers()] == [f"{c.ns}/llama"] * 2,
    )
    template = c.job()["spec"]
    assert template["suspend"] is False
    assert template["template"]["spec"]["nodeSelector"] == LENT_LABEL  # the flavor's labels

    assert (await c.actuator.lend(NODE, "for a Kueue job")).outcome is Outcome.APPLIED
    took["running on the lent node"] = await c.until(
        "the scheduler runs them on the lent node", lambda: running_on(c.pods(), NODE)
    )
    # The informer hears of the placement by its watch, a moment after the server has it.
    await c.until("the informer no longer counts them as takers", lambda: c.takers() == [], 10)
    return took


async def test_a_queued_job_is_lent_a_node_and_a_reclaim_leaves_its_workload_admitted(
    server: kube.KubeServer, tmp_path: Path
) -> None:
    """Kueue's defaults (no ``waitForPodsReady``): a reclaim's evictions are the Job's business;
    the Workload stays admitted and the replacement pods are the takers."""
    async with kueue_and_controller(server, tmp_path) as c:
        took = await admitted_and_running(c)
        first = {p["metadata"]["name"] for p in c.pods()}
        deadline = datetime.now(UTC) + timedelta(minutes=5)
        await evictions_begin(c, deadline)
        took["replaced, pending"] = await c.until(
            "the Job replaces the evicted pods; they wait (the node serves again)",
            lambda: (
                (pods := c.pods())
                and {p["metadata"]["name"] for p in pods}.isdisjoint(first)
                and len(pods) == 2
            ),
        )
        assert all(not p["spec"].get("nodeName") for p in c.pods())
        await c.until(
            "the informer counts the replacements as takers",
            lambda: [j for _, j in c.takers()] == [f"{c.ns}/llama"] * 2,
            10,
        )
        after = c.workload()
        assert "admission" in after["status"]
        assert conditions(after)["Admitted"] == "True/Admitted"
        assert "Evicted" not in conditions(after)
        assert c.job()["spec"]["suspend"] is False
        await reclaimed(c)
        print(took)  # the timings, shown with -s


async def test_with_wait_for_pods_ready_a_reclaim_requeues_the_workload_as_a_taker(
    server: kube.KubeServer, tmp_path: Path
) -> None:
    """``waitForPodsReady``: the evicted pods are not replaced in time, so Kueue evicts the
    Workload (``PodsReadyTimeout``), suspends the Job and requeues it: the Workload waits,
    with no pod, and is a taker again; quota being free, Kueue admits it again at once.

    The pods have 60 s to become ready once admitted (a busy machine needs more than a few
    seconds to lend the node and start them) and 5 s to recover once they were: the reclaim
    must meet a Workload whose pods run, not one Kueue has already evicted for a slow start."""
    wait = {
        "waitForPodsReady": {
            "timeout": "60s",
            "recoveryTimeout": "5s",
            "blockAdmission": False,
            "requeuingStrategy": {
                "timestamp": "Eviction",
                "backoffBaseSeconds": 5,
                "backoffMaxSeconds": 5,
            },
        }
    }
    async with kueue_and_controller(server, tmp_path, wait) as c:
        await admitted_and_running(c)
        await c.until(
            "Kueue sees the Workload's pods ready",
            lambda: conditions(c.workload()).get("PodsReady", "").startswith("True/"),
        )
        name = c.workload()["metadata"]["name"]
        deadline = datetime.now(UTC) + timedelta(minutes=5)
        await evictions_begin(c, deadline)
        took = {}
        took["workload evicted"] = await c.until(
            "Kueue evicts the Workload and suspends the Job",
            lambda: conditions(c.workload()).get("Evicted", "").startswith("True/PodsReadyTimeout"),
        )
        took["workload a taker again"] = await c.until(
            "the requeued Workload is a taker again",
            lambda: [n for n, _ in c.takers()] == [f"{name}/main-0", f"{name}/main-1"],
        )
        assert c.job()["spec"]["suspend"] is True
        took["admitted again"] = await c.until(
            "quota being free, Kueue admits it again",
            lambda: "admission" in c.workload().get("status", {}),
        )
        await reclaimed(c)
        print(took)  # the timings, shown with -s


async def test_with_its_webhooks_kueue_suspends_a_queued_job_itself(
    server: kube.KubeServer, tmp_path: Path
) -> None:
    """Kueue's webhooks called by the API server, through a Service whose endpoint is this
    machine's address: a Job created running is stored suspended by Kueue's defaulting
    webhook, and the rest goes as without webhooks."""
    address = kueue.host_address()
    if address is None:
        # Not a fault of the code under test: kube-apiserver refuses a loopback endpoint for a
        # webhook Service, so a machine with loopback alone cannot call Kueue's webhooks at all.
        # The webhook-less tests above cover the Workload reading on every machine.
        pytest.skip("no non-loopback IPv4 address: the API server cannot reach a webhook")
    async with kueue_and_controller(server, tmp_path, webhooks=address) as c:
        took = await admitted_and_running(c, suspend=False)
        await reclaimed(c)
        print(took)  # the timings, shown with -s
