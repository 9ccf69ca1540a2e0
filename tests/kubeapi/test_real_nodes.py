"""Real nodes: a real kubelet over containerd and runc (``tests/support/realnode.py``), so that
a pod is a process, and what a reclaim does to training is what the process records, not what
KWOK is told to say.

A node registers with the session's control plane (kube-scheduler, kube-controller-manager,
KWOK for the other nodes) and runs the images built here (``tests/support/images.py``). The
training process records each event with the time since boot, which the test maps onto the
wall clock: ``start`` or ``resume`` (it found its checkpoint), ``prestop`` (its hook),
``sigterm``, ``checkpoint`` (written whole), ``exit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rebalancer.core.audit import Kind
from tests.support import images, kube, realnode
from tests.support.chart import NAMESPACE, RELEASE, render
from tests.support.control_plane import ControlPlane
from tests.support.deployed import chart_values, controller
from tests.support.exporter import Exporter, serve_exporter
from tests.support.processes import free_port, read_audit
from tests.support.prometheus import scraping
from tests.support.reads import scheduling
from tests.support.training_cluster import (
    GPU_LABELS,
    INFERENCE_TAINT,
    JOB_NAME,
    POOL_KEY,
    Api,
    answered,
    budget,
    conditions,
    gpu_node,
    namespace,
    running_ready,
    schedulable,
    serving,
    training_job,
)
from tests.support.waits import counted, until, wait

Obj = dict[str, Any]
STATE = "rebalancer.io/state"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}"


@pytest.fixture(scope="module")
def volatile() -> frozenset[str]:
    """The kernel settings that change by themselves here: not a node's doing."""
    return realnode.settled_sysctls()


def evict(server: kube.KubeServer, namespace: str, name: str) -> float:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    posted = time.time()
    code, doc = server.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)
    assert code == 201, doc
    return posted


def ensure_namespace(server: kube.KubeServer, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    code, doc = server.request("POST", "/api/v1/namespaces", body)
    assert code in (201, 409), doc


def test_a_pod_killed_at_its_grace_and_the_machine_as_it_was(
    plane: ControlPlane, tmp_path: Path, volatile: frozenset[str]
) -> None:
    """Two nodes side by side, each with its own bridge, subnet and cgroup root; on one, a
    server answers its readiness probe; on the other, a checkpoint longer than the grace period:
    the preStop hook and the SIGTERM arrive at once, the kubelet kills the process at its grace
    period (137), no checkpoint is left. Once the nodes are stopped: no process, bridge, cgroup,
    mount or kernel setting of theirs is left."""
    server = plane.server
    before = realnode.machine()
    records = tmp_path / "records"
    records.mkdir()
    grace = 3
    with (
        realnode.running(server, kube.binaries(), tmp_path / "serving", "real-3") as serving,
        realnode.running(server, kube.binaries(), tmp_path / "node", "real-0") as node,
    ):
        assert serving.slot != node.slot
        ensure_namespace(server, "real-grace")
        answers: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "answers", "namespace": "real-grace"},
            "spec": {
                "nodeName": serving.name,
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": "server",
                        "image": images.INFERENCE,
                        "imagePullPolicy": "Never",
                        "readinessProbe": {
                            "httpGet": {"path": "/", "port": 8080},
                            "periodSeconds": 1,
                        },
                    }
                ],
            },
        }
        code, doc = server.request("POST", "/api/v1/namespaces/real-grace/pods", answers)
        assert code == 201, doc
        pod: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "slow", "namespace": "real-grace"},
            "spec": {
                "nodeName": node.name,
                "terminationGracePeriodSeconds": grace,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "trainer"}],
            },
        }
        realnode.training(pod, records, seconds=30, size=30_000, checkpoint="slow.ckpt")
        created = time.time()
        code, doc = server.request("POST", "/api/v1/namespaces/real-grace/pods", pod)
        assert code == 201, doc
        started = wait("the process started", lambda: realnode.records(records, "slow"), 30)
        posted = evict(server, "real-grace", "slow")

        seen: list[Obj] = []  # the container's terminated state, once reported

        def terminated() -> bool:
            code, doc = server.request("GET", "/api/v1/namespaces/real-grace/pods/slow")
            statuses = doc.get("status", {}).get("containerStatuses") or [] if code == 200 else []
            seen.extend(s["state"]["terminated"] for s in statuses if "terminated" in s["state"])
            return bool(seen)

        ended = wait("the container terminated", terminated, 30)
        path = "/api/v1/namespaces/real-grace/pods/slow"
        gone = wait("the pod gone", lambda: server.request("GET", path)[0] == 404, 30)
        events = {r.event: r.at for r in realnode.records(records, "slow") if r.event != "notice"}
        rss = {
            what: realnode.rss(pid)
            for what, pid in (("kubelet", node.kubelet), ("containerd", node.containerd))
        }
        print(
            f"\nreal node: RSS {rss}; Ready {node.ready_after:.2f}s after the kubelet started; "
            f"pod started {started - created:.2f}s after its creation; after the eviction: preStop "
            f"{events['prestop'] - posted:+.2f}s, SIGTERM {events['sigterm'] - posted:+.2f}s, "
            f"terminated ({seen[-1]['exitCode']}) {ended - posted:+.2f}s, "
            f"gone {gone - posted:+.2f}s"
        )
        assert seen[-1]["exitCode"] == 137, seen[-1]  # SIGKILL
        assert list(events) == ["start", "prestop", "sigterm"], events
        assert events["prestop"] <= events["sigterm"]
        assert 0 <= events["sigterm"] - posted < 5.0  # within a second here; a busy CI is slower
        assert grace - 0.5 <= ended - events["sigterm"] < grace + 5
        assert not (records / "slow.ckpt").exists()

        def answering() -> bool:
            _, doc = server.request("GET", "/api/v1/namespaces/real-grace/pods/answers")
            return bool(conditions(doc).get("Ready", {}).get("status") == "True")

        wait("the server's readiness probe answered", answering, 30)
        _, doc = server.request("GET", "/api/v1/namespaces/real-grace/pods/answers")
        assert doc["status"]["podIP"].startswith(f"10.244.{serving.slot}."), doc["status"]
    after = realnode.machine()
    assert realnode.traces(node) == []
    assert realnode.traces(serving) == []
    changed = {
        k
        for k in before.sysctls.keys() | after.sysctls.keys()
        if k not in volatile and before.sysctls.get(k) != after.sysctls.get(k)
    }
    assert changed == set(), {k: (before.sysctls.get(k), after.sysctls.get(k)) for k in changed}
    assert after.mounts == before.mounts, after.mounts ^ before.mounts
    assert after.links == before.links, after.links ^ before.links
    assert after.cgroups == before.cgroups, after.cgroups ^ before.cgroups
    assert after.paths == before.paths
    for name in (node.name, serving.name):
        code, _ = server.request("DELETE", f"/api/v1/nodes/{name}")
        assert code == 200


# -- A reclaim end to end, the borrowed pod on a real node ----------------------------------------

GRACE = 10  # the Job's pods' terminationGracePeriodSeconds
DEADLINE = 8  # the pool's reclaim_deadline, seconds
CHECKPOINT_BYTES = 3_000_000
LOW, HIGH = 5.0, 200.0  # LOW needs the 2 serving nodes; HIGH more than the pool
SERVES = "rebalancer.test/serves"  # on the nodes the inference replicas run on
JOB = "train"


@dataclass(frozen=True)
class Case:
    """The pool ``gpu-pool=<pool>``: two KWOK nodes the inference replicas take, and the node
    lent, ``real`` (one of ``kube.NODE_TOKENS``) or KWOK's when empty. Its Job's one pod
    checkpoints for ``checkpoint`` seconds under a budget of ``min_available``."""

    pool: str
    real: str
    min_available: int
    checkpoint: int

    @property
    def lent(self) -> str:
        return self.real or f"{self.pool}-lent"


FITS = Case("fits", "real-1", min_available=0, checkpoint=3)  # within its grace
REFUSED = Case("refused", "real-2", min_available=1, checkpoint=60)  # the deadline ends it
KWOK = Case("kwok", "", min_available=0, checkpoint=3)  # FITS with KWOK's node, to compare


@contextlib.contextmanager
def lent_node(plane: ControlPlane, case: Case, home: Path) -> Iterator[None]:
    """The case's node to lend, Ready, inference's taint on it, 8 GPUs; deleted at the end."""
    server = plane.server
    labels = {POOL_KEY: case.pool, **GPU_LABELS}
    with contextlib.ExitStack() as stack:
        if case.real:
            taint = "{key}={value}:{effect}".format(**INFERENCE_TAINT)
            stack.enter_context(
                realnode.running(server, kube.binaries(), home, case.real, labels, [taint])
            )
            gpus = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"}]
            code, doc = server.request(
                "PATCH",
                f"/api/v1/nodes/{case.real}/status",
                gpus,
                content_type="application/json-patch+json",
            )
            assert code == 200, doc
        else:
            code, doc = server.request("POST", "/api/v1/nodes", gpu_node(case.lent, case.pool))
            assert code == 201, doc
        try:
            yield
        finally:
            server.request("DELETE", f"/api/v1/nodes/{case.lent}")


def serving_node(name: str, pool: str) -> Obj:
    node = gpu_node(name, pool)
    node["metadata"]["labels"][SERVES] = "true"
    return node


def the_job(case: Case, namespace: str, records: Path) -> Obj:
    job = training_job(JOB, namespace, case.pool, 1, f"{case.checkpoint}s", GRACE)
    template = job["spec"]["template"]
    if case.real:
        realnode.training(template, records, case.checkpoint, CHECKPOINT_BYTES, gpus=8)
    return job


@pytest.mark.parametrize("case", [FITS, REFUSED, KWOK], ids=lambda c: c.pool)
async def test_a_borrowed_pod_on_a_real_node_is_taken_back_and_runs_again(
    plane: ControlPlane, case: Case, tmp_path: Path
) -> None:
    server = plane.server
    inference, training = f"{case.pool}-serving", f"{case.pool}-training"
    records = tmp_path / "records"
    records.mkdir()
    serving_nodes = [f"{case.pool}-s{i}" for i in range(2)]
    nodes_of = [*serving_nodes, case.lent]
    async with Api.session_for(server) as session:
        api = Api(server.url, session)
        await api.ask("DELETE", LEASE_PATH)
        for name in (inference, training):
            await api.create("/api/v1/namespaces", namespace(name))
        for name in serving_nodes:
            await api.create("/api/v1/nodes", serving_node(name, case.pool))
        with lent_node(plane, case, tmp_path / "node"):

            async def nodes_ready() -> bool:
                nodes = await api.nodes()
                return all(n in nodes and schedulable(nodes[n]) for n in nodes_of)

            await until("the nodes Ready, not-ready taken off", nodes_ready, None, 30)
            deployment = serving(2, inference, case.pool)
            deployment["spec"]["template"]["spec"]["nodeSelector"][SERVES] = "true"
            await api.create(f"/apis/apps/v1/namespaces/{inference}/deployments", deployment)

            async def replicas() -> list[Obj]:
                return [p for p in await api.pods(inference) if running_ready(p)]

            await until("the inference replicas running", lambda: counted(replicas, 2), None, 30)
            placed = {
                f"{inference}/{p['metadata']['name']}": p["spec"]["nodeName"]
                for p in await replicas()
            }
            original = scheduling((await api.nodes())[case.lent])

            async def job_pods() -> list[Obj]:
                return await api.pods(training, f"{JOB_NAME}={JOB}")

            async def on_lent() -> list[Obj]:
                return [
                    p
                    for p in await job_pods()
                    if running_ready(p) and p["spec"].get("nodeName") == case.lent
                ]

            async def lent() -> bool:
                labels = (await api.nodes())[case.lent]["metadata"]["labels"]
                return STATE in labels

            async def started(what: str, read: Any, proc: Any) -> str:
                """The one pod ``read`` gives, once running on the lent node (and its process
                started, on a real node); its name."""
                await until(f"{what} running on the lent node", lambda: counted(read, 1), proc, 60)
                (pod,) = await read()
                name: str = pod["metadata"]["name"]
                if case.real:
                    await until(f"{what}'s process started", _recorded(records, name), proc, 20)
                return name

            exporter = Exporter(pods=placed, rps=LOW)
            async with (
                serve_exporter(exporter) as target,
                scraping(tmp_path / "prometheus", target) as prom,
            ):
                docs = render(chart_values(prom, free_port(), case.pool, DEADLINE))
                mark = server.audit_mark()
                async with controller(server, docs, tmp_path) as (c, audit_url):
                    await asyncio.sleep(3)  # three ticks: idle, but no one to lend it to
                    assert not await lent()
                    budgets = f"/apis/policy/v1/namespaces/{training}/poddisruptionbudgets"
                    await api.create(budgets, budget(JOB, training, case.min_available))
                    job = the_job(case, training, records)
                    await api.create(f"/apis/batch/v1/namespaces/{training}/jobs", job)
                    first_name = await started("the Job's pod", on_lent, c.proc)

                    # -- demand rises: taken back ---------------------------------------------
                    exporter.set_load(HIGH, 0)
                    raised = time.time()
                    times: dict[str, float] = {}

                    async def back() -> bool:
                        pods = {p["metadata"]["name"] for p in await job_pods()}
                        node = (await api.nodes())[case.lent]
                        if first_name not in pods:
                            times.setdefault("gone", time.time())
                        if scheduling(node) == original:
                            times.setdefault("serving", time.time())
                        return len(times) == 2

                    await until("the pod gone, the node serving", back, c.proc, DEADLINE + 40)

                    # -- the Job makes its pod again; demand falls: it runs on the node -------
                    async def again() -> list[Obj]:
                        return [p for p in await on_lent() if p["metadata"]["name"] != first_name]

                    exporter.set_load(LOW, 0)
                    second_name = await started("the re-created pod", again, c.proc)
                    audit = await read_audit(audit_url)
            log = c.err.decode(errors="replace")
            assert c.proc.returncode == 0, log[-3000:]
            assert "Traceback" not in log, log[-3000:]
            await _deleted(api, training)
            await api.ask("DELETE", LEASE_PATH)
        for name in serving_nodes:
            await api.ask("DELETE", f"/api/v1/nodes/{name}")

    # -- when each thing happened -----------------------------------------------------------------
    reclaims = [r for r in audit if r.kind is Kind.INTENT and r.action == "reclaim"]
    assert [r.node for r in reclaims] == [case.lent], reclaims
    decided = reclaims[0].time.timestamp()
    mine = [a for a in answered(server, kube.CONTROLLER_USER, mark) if a.namespace == training]
    evictions = [(a.code, a.at.timestamp()) for a in mine if a.resource == "pods/eviction"]
    deletions = [a.at.timestamp() for a in mine if (a.verb, a.resource) == ("delete", "pods")]
    evicted = [at for code, at in evictions if code == 201]
    told = evicted[0] if evicted else deletions[0]  # the write that ends the pod
    figures = {
        "decided→told": told - decided,
        "told→gone": times["gone"] - told,
        "decided→serving": times["serving"] - decided,
        "rise→decided": decided - raised,
    }
    first_records = {r.event: r.at for r in realnode.records(records, first_name)}
    if case.real:
        figures["told→SIGTERM"] = first_records["sigterm"] - told
        if "exit" in first_records:
            figures["SIGTERM→exit"] = first_records["exit"] - first_records["sigterm"]
    print(f"\nreal-nodes[{case.pool}]: " + ", ".join(f"{k} {v:.2f}s" for k, v in figures.items()))

    if case.min_available == 0:
        assert [code for code, _ in evictions] == [201], evictions
        assert deletions == []
    else:  # refused every pass until the deadline, then deleted
        assert {code for code, _ in evictions} == {429}, evictions
        assert len(deletions) == 1, deletions
        assert DEADLINE - 2 <= deletions[0] - evictions[0][1] <= DEADLINE + 8, (
            evictions,
            deletions,
        )
    if not case.real:
        return
    second_records = [r.event for r in realnode.records(records, second_name)]
    checkpoint = records / "checkpoint-0"
    assert first_records["prestop"] <= first_records["sigterm"]
    assert 0 <= first_records["sigterm"] - told < 5.0, figures
    if case.checkpoint < GRACE:  # written whole, then the process ends by itself
        events = [e for e in first_records if e != "notice"]
        assert events == ["start", "prestop", "sigterm", "checkpoint", "exit"], events
        assert case.checkpoint - 0.5 <= figures["SIGTERM→exit"] <= case.checkpoint + 3
        assert checkpoint.stat().st_size == CHECKPOINT_BYTES
        assert second_records[0] == "resume", second_records  # it found its checkpoint
    else:  # killed (the deletion's grace is 0): no checkpoint, the next run starts over
        assert [e for e in first_records if e != "notice"] == ["start", "prestop", "sigterm"]
        assert not checkpoint.exists()
        assert second_records[0] == "start", second_records


def _recorded(records: Path, pod: str) -> Any:
    async def check() -> bool:
        return bool(realnode.records(records, pod))

    return check


async def _deleted(api: Api, namespace: str) -> None:
    """The Job gone with its pods: a pod left on a node would outlive it."""
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{JOB}?propagationPolicy=Background"
    await api.ask("DELETE", path)
    pods = f"/api/v1/namespaces/{namespace}/pods?labelSelector={JOB_NAME}%3D{JOB}"
    await api.ask("DELETE", pods + "&gracePeriodSeconds=0")  # no checkpoint to wait for

    async def gone() -> bool:
        return not await api.pods(namespace, f"{JOB_NAME}={JOB}")

    await until("the Job's pods gone", gone, None, 60)
