"""The job side of the reclaim notice on a real node: ``examples/reclaim-notice`` as a user
applies it (its ``job.yaml``: the ServiceAccount, Role and RoleBinding as written, the Job's pod
template; its ``train.py`` from a ConfigMap) run by a real kubelet, in an image of this
machine's Python (``controller_image.python``: 70 MB, imported by the node in 2-4 s where the
controller's image, which has a Python too, takes 13-15 s).

The test writes the notice as the controller writes it (a merge patch of the two pod
annotations) and reads what follows from the process's own log, its checkpoint and its pod:
the kubelet refreshing the downward-API file, the checkpoint, the acknowledgement, the exit.

What this server and node lack, the pod is given by the test, and only that: the ServiceAccount
admission plugin is off on the session's server, so the pod carries the projected token volume
that plugin adds (and the namespace the ``kube-root-ca.crt`` ConfigMap the root-CA publisher
writes); no kube-proxy routes the ``kubernetes`` Service, so the pod runs in the node's network
and is told the server's address; no volume provisioner runs, so the checkpoints go to a host
directory in place of the claim.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support import controller_image, kube, realnode
from tests.support.control_plane import ControlPlane
from tests.support.processes import ROOT

Obj = dict[str, Any]
EXAMPLE = ROOT / "examples" / "reclaim-notice"
NAMESPACE = "notice-job"  # in place of the example's
NODE = "real-4"
PREFIX = "rebalancer.io/"
STEP = 0.1  # seconds per pretend step
ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# What the ServiceAccount admission plugin adds to every pod that mounts its token.
CA = {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
OWN_NAMESPACE = {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
TOKEN_VOLUME = {
    "name": "kube-api-access",
    "projected": {
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": CA},
            {"downwardAPI": {"items": [OWN_NAMESPACE]}},
        ]
    },
}


@dataclass(frozen=True)
class Cluster:
    server: kube.KubeServer
    node: realnode.RealNode
    job: Obj  # the example's Job, in NAMESPACE
    home: Path


def manifests() -> list[Obj]:
    """The example's objects, moved to ``NAMESPACE``."""
    docs: list[Obj] = list(yaml.safe_load_all((EXAMPLE / "job.yaml").read_text()))
    for doc in docs:
        doc["metadata"]["namespace"] = NAMESPACE
        for subject in doc.get("subjects", []):
            subject["namespace"] = NAMESPACE
    return docs


def create(server: kube.KubeServer, path: str, body: Obj) -> None:
    code, doc = server.request("POST", path, body)
    assert code in (201, 409), doc


PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
}


@pytest.fixture(scope="module")
def cluster(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One real node with the Python image, and the example's account, Role and binding."""
    server = plane.server
    home = tmp_path_factory.mktemp("notice-job")
    image = controller_image.python()
    with realnode.running(
        server, kube.binaries(), home / "node", NODE, extra_images=[image]
    ) as node:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        create(server, "/api/v1/namespaces", namespace)
        docs = manifests()
        for doc in docs:
            if doc["kind"] in PATHS:
                create(server, PATHS[doc["kind"]].format(ns=NAMESPACE), doc)
        (job,) = [d for d in docs if d["kind"] == "Job"]
        # The Job as written is one the server takes (validated, not created).
        jobs = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
        code, answer = server.request("POST", jobs + "?dryRun=All", job)
        assert code == 201, answer
        configmaps = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
        code_map = {"train.py": (EXAMPLE / "train.py").read_text()}
        for name, data in (
            ("trainer-code", code_map),
            ("kube-root-ca.crt", {"ca.crt": server.ca.read_text()}),
        ):
            config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
            create(server, configmaps, config_map | {"data": data})
        try:
            yield Cluster(server, node, job, home)
        finally:
            server.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
    server.request("DELETE", f"/api/v1/nodes/{NODE}")


def pod_of(cluster: Cluster, name: str, checkpoints: Path, grace: int) -> Obj:
    """The Job's pod template as a pod ``name`` on the real node, with what this cluster lacks
    (the module's docstring) and quick steps."""
    spec = copy.deepcopy(cluster.job["spec"]["template"]["spec"])
    address = urlsplit(cluster.server.url)
    spec |= {"nodeName": NODE, "hostNetwork": True, "terminationGracePeriodSeconds": grace}
    (container,) = spec["containers"]
    container["image"], container["imagePullPolicy"] = controller_image.PYTHON, "Never"
    container["env"] += [
        {"name": "KUBERNETES_SERVICE_HOST", "value": address.hostname},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(address.port)},
        {"name": "STEP_SECONDS", "value": str(STEP)},
        {"name": "CHECKPOINT_EVERY", "value": "10"},  # every second
    ]
    container["volumeMounts"].append({"name": TOKEN_VOLUME["name"], "mountPath": ACCOUNT})
    (claim,) = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    claim.pop("persistentVolumeClaim")
    claim["hostPath"] = {"path": str(checkpoints), "type": "Directory"}
    spec["volumes"].append(TOKEN_VOLUME)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def started(cluster: Cluster, name: str, grace: int) -> Path:
    """The pod ``name`` created and its process started; its checkpoint directory."""
    checkpoints = cluster.home / name
    checkpoints.mkdir()
    pod = pod_of(cluster, name, checkpoints, grace)
    code, doc = cluster.server.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    assert code == 201, doc
    wait("the process started", lambda: logged(cluster, name, "starting at step"), 60)
    return checkpoints


def logged(cluster: Cluster, pod: str, start: str) -> dict[str, float]:
    """The lines of the trainer's log that begin with ``start`` (after the time the process
    printed), and that time."""
    found = {}
    for line in realnode.container_log(cluster.node, NAMESPACE, pod, "trainer"):
        at, _, text = line.partition(" ")
        if text.startswith(start):
            found[text] = datetime.fromisoformat(at).timestamp()
    return found


def first(cluster: Cluster, pod: str, start: str, after: float = 0.0) -> float:
    times = [t for t in logged(cluster, pod, start).values() if t >= after]
    assert times, (start, realnode.container_log(cluster.node, NAMESPACE, pod, "trainer"))
    return min(times)


def wait(what: str, check: Any, within: float) -> float:
    """Poll ``check()`` every 0.05 s; the wall-clock time it became true."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        time.sleep(0.05)
    return time.time()


def read(cluster: Cluster, name: str) -> Obj:
    code, doc = cluster.server.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    assert code == 200, doc
    pod: Obj = doc
    return pod


def annotations_of(doc: Obj) -> dict[str, str]:
    return dict(doc["metadata"].get("annotations") or {})


def terminated(doc: Obj) -> Obj | None:
    statuses = doc.get("status", {}).get("containerStatuses") or []
    ended = [s["state"]["terminated"] for s in statuses if "terminated" in s["state"]]
    return ended[0] if ended else None


def saved_step(checkpoints: Path) -> int:
    return int(json.loads((checkpoints / "checkpoint.json").read_text())["step"])


def rfc3339(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_notice_is_answered_by_a_checkpoint_an_ack_and_exit_143(cluster: Cluster) -> None:
    name, reclaim_id = "noticed", "r-test-1"
    checkpoints = started(cluster, name, grace=30)
    # Its periodic checkpoint reported with its own token: the Role lets it patch its pod.
    wait(
        "a periodic last-checkpoint-time",
        lambda: PREFIX + "last-checkpoint-time" in annotations_of(read(cluster, name)),
        30,
    )
    deadline = datetime.now(UTC) + timedelta(seconds=60)
    notice = {PREFIX + "reclaim-deadline": rfc3339(deadline), PREFIX + "reclaim-id": reclaim_id}
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
    code, doc = cluster.server.request(
        "PATCH",
        path,
        {"metadata": {"annotations": notice}},
        content_type="application/merge-patch+json",
    )
    written = time.time()
    assert code == 200, doc

    times: dict[str, float] = {}
    last: list[Obj] = []

    def ended() -> bool:
        doc = read(cluster, name)
        if annotations_of(doc).get(PREFIX + "reclaim-ack") == reclaim_id:
            times.setdefault("ack on the pod", time.time())
        last[:] = [doc]
        return terminated(doc) is not None

    times["exit seen"] = wait("the container terminated", ended, 60)
    seen = first(cluster, name, "reclaim notice", written - 1)
    saved = first(cluster, name, "checkpoint saved", seen)
    reported = first(cluster, name, "reported", saved)
    exiting = first(cluster, name, "exiting 143", reported)
    figures = {
        "written→file seen": seen - written,
        "seen→checkpoint": saved - seen,
        "checkpoint→reported": reported - saved,
        "written→ack on the pod": times["ack on the pod"] - written,
        "reported→exit": exiting - reported,
        "written→exit seen": times["exit seen"] - written,
    }
    print(f"\nnotice-job: {', '.join(f'{k} {v:.2f}s' for k, v in figures.items())}")

    state = terminated(last[0])
    assert state is not None
    assert state["exitCode"] == 143, state
    got = annotations_of(last[0])
    assert got[PREFIX + "reclaim-ack"] == reclaim_id
    checkpointed = datetime.fromisoformat(got[PREFIX + "last-checkpoint-time"]).timestamp()
    assert written - 1 <= checkpointed <= exiting + 1  # the notice's checkpoint, not a periodic one
    assert saved_step(checkpoints) > 0
    # At once on the change, not at the kubelet's periodic resync (at most one step late).
    assert 0 < seen - written < realnode.SYNC_SECONDS, figures
    assert seen <= saved <= reported <= exiting <= times["exit seen"]
    assert times["ack on the pod"] <= times["exit seen"]
    delete = f"{path}?gracePeriodSeconds=0"
    assert cluster.server.request("DELETE", delete)[0] == 200


def test_sigterm_without_notice_saves_and_exits_within_its_grace(cluster: Cluster) -> None:
    name, grace = "evicted", 5
    checkpoints = started(cluster, name, grace)
    before = saved_step(checkpoints) if (checkpoints / "checkpoint.json").exists() else 0
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
    code, doc = cluster.server.request("POST", f"{path}/eviction", body)
    evicted = time.time()
    assert code == 201, doc

    last: list[Obj] = []

    def ended() -> bool:
        code, doc = cluster.server.request("GET", path)
        if code == 200 and terminated(doc) is not None:
            last[:] = [doc]
        return bool(last)

    seen = wait("the container terminated", ended, 30)
    sigterm = first(cluster, name, "SIGTERM", evicted - 1)
    exiting = first(cluster, name, "exiting 143", sigterm)
    print(
        f"\nnotice-job, evicted: eviction→SIGTERM {sigterm - evicted:.2f}s, "
        f"SIGTERM→exit {exiting - sigterm:.2f}s, eviction→exit seen {seen - evicted:.2f}s"
    )
    state = terminated(last[0])
    assert state is not None
    assert state["exitCode"] == 143, state  # its own exit, not the kubelet's kill (137)
    assert exiting - sigterm < grace
    assert first(cluster, name, "checkpoint saved", sigterm) <= exiting
    assert saved_step(checkpoints) > before
    assert PREFIX + "reclaim-ack" not in annotations_of(last[0])  # no notice, nothing to ack
    cluster.server.request("DELETE", f"{path}?gracePeriodSeconds=0")
