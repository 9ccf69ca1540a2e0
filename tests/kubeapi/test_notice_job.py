"""The job side of the reclaim notice on a real node: ``examples/reclaim-notice`` as a user
applies it (its ``job.yaml``: the ServiceAccount, Role and RoleBinding as written, the Job's pod
template; its ``train.py`` from a ConfigMap) run by a real kubelet, in an image of this
machine's Python (``controller_image.python``: 70 MB, imported by the node in 2-4 s where the
controller's image, which has a Python too, takes 13-15 s).

The test writes the notice as the controller does (the annotations ``noticing.tell`` makes, in
a merge patch) and reads what follows from the process's own log, its checkpoint and its pod:
the kubelet refreshing the downward-API file, the checkpoint, the acknowledgement, the exit;
and holds the pod's answers to what the controller reads from them (``convert.said``).

What this server and node lack, the pod is given by the test, and only that: the ServiceAccount
admission plugin is off on the session's server, so the pod carries the projected token volume
that plugin adds (and the namespace the ``kube-root-ca.crt`` ConfigMap the root-CA publisher
writes); no kube-proxy routes the ``kubernetes`` Service, so the pod runs in the node's network
and is told the server's address; no volume provisioner runs, so the checkpoints go to a host
directory in place of the claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes_asyncio import client

from rebalancer.adapters import convert, kubeclient, noticing
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.writer import KubeWriter
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import ActionResult, Notice, Outcome, WriteKind
from rebalancer.runtime import wiring
from tests.support import controller_image, kube, realnode
from tests.support.actuation import LEND, MARKS, SPEC
from tests.support.control_plane import ControlPlane
from tests.support.processes import ROOT
from tests.support.waits import wait

Obj = dict[str, Any]
EXAMPLE = ROOT / "examples" / "reclaim-notice"
NAMESPACE = "notice-job"  # in place of the example's
NODE = "real-4"
KEYS = Keys()  # the default prefix, which the example's files and answers use
PREFIX = KEYS.prefix
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


def pod_of(cluster: Cluster, name: str, checkpoints: Path, grace: int, account: str) -> Obj:
    """The Job's pod template as a pod ``name`` on the real node, running as the ServiceAccount
    ``account``, with what this cluster lacks (the module's docstring) and quick steps."""
    spec = copy.deepcopy(cluster.job["spec"]["template"]["spec"])
    address = urlsplit(cluster.server.url)
    spec |= {"nodeName": NODE, "hostNetwork": True, "terminationGracePeriodSeconds": grace}
    spec["serviceAccountName"] = account
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


@dataclass(frozen=True)
class Trainer:
    name: str
    checkpoints: Path  # the host directory its checkpoints go to
    log: IO[str]  # its container's log, held open

    def lines(self) -> list[str]:
        return realnode.log_lines(self.log)

    def logged(self, start: str) -> list[float]:
        """When the process printed each line that begins with ``start`` (the time it printed
        first on each line)."""
        found = []
        for line in self.lines():
            at, _, text = line.partition(" ")
            if text.startswith(start):
                found.append(datetime.fromisoformat(at).timestamp())
        return found

    def first(self, start: str, after: float) -> float:
        """When the process first printed a line that begins with ``start``, not before
        ``after``."""
        times = [t for t in self.logged(start) if t >= after]
        assert times, (start, self.lines())
        return min(times)

    def last_saved(self) -> int:
        """The step of the last checkpoint it said it saved."""
        said = [line for line in self.lines() if " checkpoint saved at step " in line]
        assert said, self.lines()
        return int(said[-1].rsplit(" ", 1)[1])


@contextlib.contextmanager
def started(cluster: Cluster, name: str, grace: int, account: str) -> Iterator[Trainer]:
    """The pod ``name`` created and its process started, until the block ends."""
    checkpoints = cluster.home / name
    checkpoints.mkdir()
    pod = pod_of(cluster, name, checkpoints, grace, account)
    code, doc = cluster.server.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    assert code == 201, doc
    found: list[Path] = []

    def made() -> bool:
        found[:] = filter(None, [realnode.container_log(cluster.node, NAMESPACE, name, "trainer")])
        return bool(found)

    wait("the container's log", made, 60)
    with found[0].open() as opened:
        trainer = Trainer(name, checkpoints, opened)
        wait("the process started", lambda: trainer.logged("starting at step"), 60)
        try:
            yield trainer
        finally:
            pod_path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
            cluster.server.request("DELETE", pod_path + "?gracePeriodSeconds=0")


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


def test_a_notice_is_answered_by_a_checkpoint_an_ack_and_exit_143(cluster: Cluster) -> None:
    name, reclaim_id = "noticed", "r-test-1"
    account = cluster.job["spec"]["template"]["spec"]["serviceAccountName"]  # the Role's
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
    with started(cluster, name, grace=30, account=account) as trainer:
        # Its periodic checkpoint reported with its own token: the Role lets it patch its pod.
        wait(
            "a periodic last-checkpoint-time",
            lambda: PREFIX + "last-checkpoint-time" in annotations_of(read(cluster, name)),
            30,
        )
        # What the controller writes to tell a pod, written by the controller's own function.
        notice = noticing.tell(KEYS, reclaim_id, datetime.now(UTC) + timedelta(seconds=60))
        sent = time.time()
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
        seen = trainer.first("reclaim notice", sent - 1)
        saved = trainer.first("checkpoint saved", seen)
        reported = trainer.first("reported", saved)
        exiting = trainer.first("exiting 143", reported)
        last_saved = trainer.last_saved()
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
    assert sent - 1 <= checkpointed <= exiting + 1  # the notice's checkpoint (whole seconds)
    assert saved_step(trainer.checkpoints) == last_saved  # the notice's, whole
    # What it wrote is what the controller reads as an answer, and a checkpoint it believes.
    created = convert.time_of(last[0]["metadata"]["creationTimestamp"])
    says = convert.said(got, created, KEYS.prefix)
    assert says is not None, got
    assert says.acked == reclaim_id, says
    assert says.checkpointed is not None, says
    assert says.unbelieved is None, says
    # At once on the change, not at the kubelet's periodic resync (at most one step late).
    assert sent < seen < written + realnode.SYNC_SECONDS, figures
    assert seen <= saved <= reported <= exiting <= times["exit seen"]
    assert times["ack on the pod"] <= times["exit seen"]


def test_sigterm_without_notice_or_rights_saves_and_exits_within_its_grace(
    cluster: Cluster,
) -> None:
    """The fallbacks together: no notice (an eviction's SIGTERM is all it gets) and no Role (its
    reports are refused): it still saves and exits 143, its own exit within its grace."""
    name, grace = "evicted", 5
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "no-rights"}}
    create(cluster.server, PATHS["ServiceAccount"].format(ns=NAMESPACE), account)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
    last: list[Obj] = []

    def ended() -> bool:
        code, doc = cluster.server.request("GET", path)
        if code == 200 and terminated(doc) is not None:
            last[:] = [doc]
        return bool(last)

    with started(cluster, name, grace, account="no-rights") as trainer:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
        sent = time.time()
        code, doc = cluster.server.request("POST", f"{path}/eviction", body)
        evicted = time.time()
        assert code == 201, doc
        seen = wait("the container terminated", ended, 30)
        sigterm = trainer.first("SIGTERM", sent - 1)
        saved = trainer.first("checkpoint saved", sigterm)
        refused = trainer.first("not reported (HTTP Error 403", saved)
        exiting = trainer.first("exiting 143", refused)
        last_saved = trainer.last_saved()
    print(
        f"\nnotice-job, evicted: eviction→SIGTERM {sigterm - evicted:.2f}s, "
        f"SIGTERM→exit {exiting - sigterm:.2f}s, eviction→exit seen {seen - evicted:.2f}s"
    )
    state = terminated(last[0])
    assert state is not None
    assert state["exitCode"] == 143, state  # its own exit, not the kubelet's kill (137)
    assert exiting - sigterm < grace
    assert sigterm <= saved <= exiting
    assert saved_step(trainer.checkpoints) == last_saved  # the SIGTERM's, whole
    assert not {PREFIX + "reclaim-ack", PREFIX + "last-checkpoint-time"} & set(
        annotations_of(last[0])
    )


# -- The controller's side: its actuator gives the notice on the real node ------------------------


@dataclass
class Passes:
    """The actuator's passes over the node, every ``every`` seconds, with when each kind of
    write was first made."""

    actuator: Actuator
    every: float = 0.2
    at: dict[WriteKind, float] = field(default_factory=dict)
    notices: list[Notice] = field(default_factory=list)  # what each reclaim's notice came to

    def note(self, result: ActionResult) -> ActionResult:
        for write in result.writes:
            self.at.setdefault(write.kind, time.time())
        if result.notice is not None:
            self.notices.append(result.notice)
        return result

    async def until_serving(self, within: float) -> ActionResult:
        deadline = time.monotonic() + within
        while True:
            result = self.note(await self.actuator.progress(NODE))
            if result.outcome is Outcome.APPLIED:
                return result
            # A 409 (the kubelet's status writes) is passed over as the next tick passes it.
            assert result.outcome in (Outcome.IN_PROGRESS, Outcome.CONFLICT), result
            assert time.monotonic() < deadline, f"not serving within {within}s: {result}"
            await asyncio.sleep(self.every)


@contextlib.asynccontextmanager
async def controlled(cluster: Cluster) -> AsyncIterator[Actuator]:
    """The controller's actuator for the real node, as the admin (its rights are the chart's
    business, proven elsewhere), on the wall clock as its server's."""
    kubeconfig = cluster.server.kubeconfig(cluster.home / "admin.kubeconfig")
    async with kubeclient.api_client(kubeconfig) as api:
        writer = KubeWriter(client.CoreV1Api(api), clock=wiring.utc_now)
        drain = timedelta(seconds=20)
        yield Actuator(writer, KEYS, SPEC, MARKS, wiring.utc_now, drain=drain)


async def lent(act: Actuator, decision: str) -> None:
    """The node lent, as the controller would have it after a tick or two: the kubelet writes
    the node's status every few seconds, and a write locked to the version read then meets a
    409 (the controller re-plans next tick; its next pass rolls an unfinished lend back)."""
    for _ in range(5):
        result = await act.lend(NODE, decision)
        if result.outcome is Outcome.APPLIED:
            return
        assert result.outcome is Outcome.CONFLICT, result
        await act.progress(NODE)
    raise AssertionError(f"not lent in 5 tries: {result}")


async def again_on_conflict(call: Callable[[], Awaitable[ActionResult]]) -> ActionResult:
    """``call``, made again while it meets a 409 (the kubelet's status writes), as the
    controller's next tick would make it."""
    for _ in range(5):
        result = await call()
        if result.outcome is not Outcome.CONFLICT:
            return result
    raise AssertionError(f"a conflict 5 times over: {result}")


def silent_pod(cluster: Cluster, name: str, records: Path, grace: int) -> Obj:
    """A borrowed pod whose process never answers a notice (it only records what its
    downward-API file says) and saves on SIGTERM, in 2 s: the suite's training image."""
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "tolerations": [LEND.to_doc() | {"operator": "Equal"}],
            "containers": [{"name": "trainer"}],
        },
    }
    return realnode.training(pod, records, 2, 1000, checkpoint="saved")


async def test_the_controllers_notice_is_withdrawn_unanswered_and_answered(
    cluster: Cluster,
) -> None:
    """On the real node, through the controller's actuator: a notice withdrawn (the job runs
    on, untold); a notice its pod never answers (evicted at the deadline less its grace, it
    saves on SIGTERM); and the example answering one (saved, acknowledged, exited: the node
    serves at once, nothing evicted)."""
    records = cluster.home / "silent"
    records.mkdir()
    grace, notice = 4, 10
    figures: dict[str, float] = {}
    async with controlled(cluster) as act:
        await lent(act, "lend-1")
        silent = silent_pod(cluster, "silent", records, grace)
        code, doc = cluster.server.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", silent)
        assert code == 201, doc
        wait("the silent pod's process", lambda: realnode.records(records, "silent"), 60)

        # -- withdrawn: the pod is told, then untold; it runs on -----------------------------
        def said() -> list[str]:
            return [r.detail for r in realnode.records(records, "silent") if r.event == "notice"]

        deadline = datetime.now(UTC) + timedelta(seconds=60)
        told = await again_on_conflict(lambda: act.notice(NODE, "notice-w", deadline))
        assert told.outcome is Outcome.IN_PROGRESS, told
        wait("the process sees the notice", lambda: any("notice-w" in s for s in said()[-1:]), 30)
        withdrawn = await again_on_conflict(lambda: act.withdraw(NODE, "withdraw-w"))
        assert withdrawn.outcome is Outcome.APPLIED, withdrawn
        wait(
            "the process sees it withdrawn",
            lambda: any("notice-w" not in s for s in said()[-1:]),
            30,
        )
        doc = read(cluster, "silent")
        assert PREFIX + "reclaim-id" not in annotations_of(doc)
        assert terminated(doc) is None  # it runs on

        # -- unanswered: evicted at the deadline less its grace ------------------------------
        passes = Passes(act)
        decided = time.time()
        deadline = datetime.now(UTC) + timedelta(seconds=notice)
        passes.note(await again_on_conflict(lambda: act.notice(NODE, "notice-s", deadline)))
        await passes.until_serving(notice + 30)
        (came,) = passes.notices
        assert (came.reclaim, came.pods, came.answered) == ("notice-s", 1, 0), came
        assert came.why == f"the deadline less the pods' grace ({grace} s)", came
        begun = passes.at[WriteKind.BEGIN_RECLAIM]
        figures["silent: decided→evicted"] = passes.at[WriteKind.EVICT] - decided
        figures["silent: decided→serving"] = time.time() - decided
        assert notice - grace - 1 <= begun - decided <= notice - grace + 2, figures
        recorded = realnode.records(records, "silent")
        assert [r.event for r in recorded][-3:] == ["sigterm", "checkpoint", "exit"], recorded
        sigterm = next(r.at for r in recorded if r.event == "sigterm")
        figures["silent: evicted→SIGTERM"] = sigterm - passes.at[WriteKind.EVICT]

        # -- answered: the example saves, acknowledges and exits -----------------------------
        await lent(act, "lend-2")
        account = cluster.job["spec"]["template"]["spec"]["serviceAccountName"]
        with started(cluster, "answering", grace=30, account=account) as trainer:
            passes = Passes(act)
            decided = time.time()
            deadline = datetime.now(UTC) + timedelta(seconds=60)
            told = await again_on_conflict(lambda: act.notice(NODE, "notice-a", deadline))
            passes.note(told)
            written = passes.at[WriteKind.NOTICE]
            await passes.until_serving(30)
            serving = time.time()
            seen = trainer.first("reclaim notice", decided - 1)
            saved = trainer.first("checkpoint saved", seen)
            reported = trainer.first("reported", saved)  # its acknowledgement, on its pod
            exiting = trainer.first("exiting 143", reported)
        (came,) = passes.notices
        assert (came.pods, came.answered, came.lost_gpu_seconds) == (1, 1, 0), came
        assert came.why == "every borrowed pod answered", came
        figures |= {
            "answered: decided→notice written": written - decided,
            "answered: written→process saw it": seen - written,
            "answered: saw→checkpoint": saved - seen,
            "answered: checkpoint→acknowledged": reported - saved,
            "answered: acknowledged→reclaim began": passes.at[WriteKind.BEGIN_RECLAIM] - reported,
            "answered: acknowledged→exit": exiting - reported,
            "answered: decided→serving": serving - decided,
        }
        assert serving - decided < 20, figures  # long before the deadline less its grace
    print(f"\nnotice, controller side: {', '.join(f'{k} {v:.2f}s' for k, v in figures.items())}")
