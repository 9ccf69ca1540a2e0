"""The reclaim notice's pod writes beside a real kubelet (``tests/support/realnode.py``), which
writes the pod's status itself all the time: the kubelet keeps the controller's condition when
it writes its own, and the process reads the notice's deadline from its downward-API file."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from rebalancer.adapters import kubeclient
from rebalancer.adapters.writer import KubeWriter
from tests.support import kube, realnode
from tests.support.training_cluster import conditions
from tests.support.waits import wait

Obj = dict[str, Any]
NS, POD = "real-notice", "noticed"
DEADLINE, RECLAIM_ID = "rebalancer.io/reclaim-deadline", "rebalancer.io/reclaim-id"
NOTICE = "rebalancer.io/ReclaimNotice"
SCHEDULED = {
    "type": NOTICE,
    "status": "True",
    "reason": "ReclaimScheduled",
    "message": "reclaim r-1: evicted at 2026-12-04T09:35:00Z",
}
WITHDRAWN = {"type": NOTICE, "status": "False", "reason": "ReclaimWithdrawn", "message": "r-1"}


def pod(server: kube.KubeServer) -> Obj:
    code, doc = server.request("GET", f"/api/v1/namespaces/{NS}/pods/{POD}")
    assert code == 200, doc
    return dict(doc)


def notices(records: Path) -> list[str]:
    """What the process read from its annotations file, each time it changed."""
    return [r.detail for r in realnode.records(records, POD) if r.event == "notice"]


async def test_the_kubelet_keeps_our_condition_and_the_process_reads_the_deadline(
    real: kube.KubeServer, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    with realnode.running(real, kube.binaries(), tmp_path / "node", "real-1") as node:
        code, doc = real.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        )
        assert code in (201, 409), doc
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": POD, "namespace": NS, "annotations": {"example.com/team": "ml"}},
            "spec": {
                "nodeName": node.name,
                "terminationGracePeriodSeconds": 1,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "trainer"}],
            },
        }
        realnode.training(body, records, seconds=0, size=0)
        # Ready once the test says so: a status write of the kubelet's after ours.
        probe = {"exec": {"command": ["test", "-f", "/records/ready"]}, "periodSeconds": 1}
        body["spec"]["containers"][0]["readinessProbe"] = probe
        code, doc = real.request("POST", f"/api/v1/namespaces/{NS}/pods", body)
        assert code == 201, doc
        uid = doc["metadata"]["uid"]
        wait("the process started", lambda: bool(realnode.records(records, POD)), 60)
        wait(
            "the kubelet reported the pod running, not ready",
            lambda: (
                pod(real)["status"].get("phase") == "Running"
                and conditions(pod(real)).get("Ready", {}).get("status") == "False"
            ),
            30,
        )

        async with kubeclient.api_client(real.kubeconfig(tmp_path / "kubeconfig")) as api:
            writer = KubeWriter(client.CoreV1Api(api), clock=lambda: datetime.now(UTC))
            ours = {DEADLINE: "2026-12-04T09:35:00Z", RECLAIM_ID: "r-1"}
            assert await writer.annotate_pod(NS, POD, uid, ours)
            assert await writer.set_pod_condition(NS, POD, uid, SCHEDULED)
            written = conditions(pod(real))[NOTICE]

            wait(
                "the process read the deadline from its downward-API file",
                lambda: any(
                    DEADLINE in n and "2026-12-04T09:35:00Z" in n for n in notices(records)
                ),
                60,
            )
            (records / "ready").touch()
            wait(
                "the kubelet wrote Ready",
                lambda: conditions(pod(real)).get("Ready", {}).get("status") == "True",
                30,
            )
            now = pod(real)
            assert conditions(now)[NOTICE] == written
            assert {k: written[k] for k in SCHEDULED} == SCHEDULED
            assert {"Ready", "ContainersReady", "Initialized", "PodScheduled"} <= set(
                conditions(now)
            )
            assert now["metadata"]["annotations"] == {"example.com/team": "ml", **ours}

            # Withdrawn: the deadline goes from the file, the condition turns False.
            assert await writer.annotate_pod(NS, POD, uid, {DEADLINE: None, RECLAIM_ID: None})
            assert await writer.set_pod_condition(NS, POD, uid, WITHDRAWN)
            wait(
                "the process saw the deadline go",
                lambda: DEADLINE not in notices(records)[-1],
                60,
            )
            (records / "ready").unlink()
            wait(
                "the kubelet wrote Ready False",
                lambda: conditions(pod(real)).get("Ready", {}).get("status") == "False",
                30,
            )
            after = pod(real)
            notice = conditions(after)[NOTICE]
            assert {k: notice[k] for k in WITHDRAWN} == WITHDRAWN
            assert notice["lastTransitionTime"] >= written["lastTransitionTime"]
            assert after["metadata"]["annotations"] == {"example.com/team": "ml"}

        code, doc = real.request(
            "DELETE", f"/api/v1/namespaces/{NS}/pods/{POD}?gracePeriodSeconds=0"
        )
        assert code == 200, doc
    code, _ = real.request("DELETE", f"/api/v1/nodes/{node.name}")
    assert code == 200
