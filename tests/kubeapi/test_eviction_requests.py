"""The controller as an EvictionRequest requester (``adapters.evictionrequests``) on a real
kube-apiserver 1.37, the first release that serves the API (KEP-4563), with its gate on and off.

The binary is built from its Go module by ``tests/kube/v1.37/build.sh`` (once, on first use:
minutes) and runs on the suite's etcd. Two servers per module: one with the
``EvictionRequestAPI`` gate on and ``lifecycle.k8s.io/v1alpha1`` enabled (an alpha group is off
until ``--runtime-config`` enables it, whatever its gate), one as a cluster is by default.

1.37 ships no evictionrequest-controller: nothing sets a request's ``observedGeneration``, makes
its Eviction or evicts its pod. What a responder reports is read from an Eviction written here as
that controller would write it (the admin may; the default roles leave it to the controller).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import evictionrequests as er
from rebalancer.adapters import kubeclient
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.writer import ApiFailure, Conflict, KubeWriter
from rebalancer.core.outcomes import Outcome, WriteKind
from rebalancer.errors import ConfigError
from rebalancer.runtime import wiring
from tests.support import control_plane, kube
from tests.support.actuation import KEYS, LEND, MARKS, SPEC

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
NAMESPACE = "training"
REQUESTER = "rebalancer.io/reclaim-notice"
BASE = f"/apis/{er.GROUP}/{er.VERSION}/namespaces/{NAMESPACE}"
# 1.37 refuses to advertise a loopback address with the endpoint reconciler that keeps the
# ``kubernetes`` Service's endpoints (1.36 did not); nothing here reads that Service.
LOOPBACK = ["--endpoint-reconciler-type=none"]
GATE_ON = [
    *LOOPBACK,
    "--feature-gates=EvictionRequestAPI=true",
    f"--runtime-config={er.GROUP}/{er.VERSION}=true",
]
CHECKPOINTER = "trainer.example.com/checkpointer"
EVICTOR = er.DEFAULT_EVICTOR


@pytest.fixture(scope="module")
def gate_on(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube.KubeServer]:
    home = tmp_path_factory.mktemp("gate-on")
    with kube.running(home, flags=GATE_ON, apiserver=kube.apiserver_137()) as server:
        _namespace(server)
        yield server


@pytest.fixture(scope="module")
def gate_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube.KubeServer]:
    home = tmp_path_factory.mktemp("gate-off")
    with kube.running(home, flags=LOOPBACK, apiserver=kube.apiserver_137()) as server:
        _namespace(server)
        yield server


def _namespace(server: kube.KubeServer) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    code, doc = server.request("POST", "/api/v1/namespaces", body)
    assert code == 201, doc


def _pod(
    server: kube.KubeServer,
    name: str,
    responders: list[Obj] | None = None,
    node: str = "gpu-1",
) -> er.Target:
    """A borrowed pod (bound at creation: no scheduler runs), with the responders it declares."""
    spec: Obj = {
        "nodeName": node,
        "containers": [{"name": "train", "image": "trainer:1"}],
        "tolerations": [LEND.to_doc() | {"operator": "Equal"}],
    }
    if responders is not None:
        spec["evictionResponders"] = responders
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    code, doc = server.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body)
    assert code == 201, doc
    return er.Target(NAMESPACE, name, doc["metadata"]["uid"])


async def _requests(server: kube.KubeServer, tmp_path: Path) -> AsyncIterator[er.EvictionRequests]:
    async with kubeclient.api_client(server.kubeconfig(tmp_path / "kubeconfig")) as api:
        yield er.KubeEvictionRequests(api, REQUESTER)


@pytest.fixture
async def on(gate_on: kube.KubeServer, tmp_path: Path) -> AsyncIterator[er.EvictionRequests]:
    """The product's client, as ``rebalancer run`` opens it, on the admin's kubeconfig."""
    async for requests in _requests(gate_on, tmp_path):
        yield requests


@pytest.fixture
async def off(gate_off: kube.KubeServer, tmp_path: Path) -> AsyncIterator[er.EvictionRequests]:
    async for requests in _requests(gate_off, tmp_path):
        yield requests


def _time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_server_is_1_37(gate_on: kube.KubeServer, gate_off: kube.KubeServer) -> None:
    assert gate_on.version.startswith("v1.37."), gate_on.version
    assert gate_off.version.startswith("v1.37."), gate_off.version


async def test_the_api_is_served_only_with_its_gate_and_group_on(
    on: er.EvictionRequests, off: er.EvictionRequests, gate_off: kube.KubeServer
) -> None:
    assert await on.served() is True
    assert await off.served() is False
    code, groups = gate_off.request("GET", "/apis")
    assert code == 200
    assert er.GROUP not in {g["name"] for g in groups["groups"]}


async def test_a_release_before_1_37_serves_none(real: kube.KubeServer, tmp_path: Path) -> None:
    """The suite's own server (1.36), as most clusters are: nothing to ask, the annotations
    alone carry the notice. (Nothing is created on that shared server: the group's path is
    refused before any object is looked at.)"""
    target = er.Target(NAMESPACE, "older-0", "3d7fdff1-3fe5-48b9-b106-1ee24b0277f6")
    async for requests in _requests(real, tmp_path):
        assert await requests.served() is False
        for call in (requests.request, requests.state, requests.withdraw, requests.remove):
            with pytest.raises(er.NotServed):
                await call(target)


async def test_a_request_is_stored_but_nothing_handles_it(
    on: er.EvictionRequests, gate_on: kube.KubeServer
) -> None:
    target = _pod(gate_on, "unhandled-0")
    state = await on.request(target)
    assert (state.intent, state.generation, state.handled) == (er.Intent.EVICTION, 1, False)
    assert state.responders == ()
    assert state.conditions == {}
    code, doc = gate_on.request(
        "GET", f"{BASE}/evictionrequests/{er.request_name(REQUESTER, target.uid)}"
    )
    assert code == 200, doc
    assert doc["spec"] == {
        "target": {"pod": {"name": target.name, "uid": target.uid}},
        "requester": REQUESTER,
        "intent": "Eviction",
    }
    assert "status" not in doc or doc["status"] == {}
    assert doc["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": target.name, "uid": target.uid}
    ]
    code, listed = gate_on.request("GET", f"{BASE}/evictions")
    assert (code, listed["items"]) == (200, [])
    code, pod = gate_on.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{target.name}")
    assert code == 200
    assert pod["metadata"].get("deletionTimestamp") is None


async def test_asking_again_withdrawing_and_asking_once_more(
    on: er.EvictionRequests, gate_on: kube.KubeServer
) -> None:
    target = _pod(gate_on, "withdrawn-0")
    first = await on.request(target)
    again = await on.request(target)  # a restart's second create meets the first: no error
    assert (first.generation, again.generation) == (1, 1)
    withdrawn = await on.withdraw(target)
    assert withdrawn is not None
    assert (withdrawn.intent, withdrawn.generation) == (er.Intent.WITHDRAWN, 2)
    renewed = await on.request(target)
    assert (renewed.intent, renewed.generation) == (er.Intent.EVICTION, 3)
    assert await on.remove(target) is True
    assert await on.state(target) is None
    assert await on.withdraw(target) is None
    assert await on.remove(target) is False


async def test_a_request_of_another_requester_under_our_name_is_left_alone(
    on: er.EvictionRequests, gate_on: kube.KubeServer
) -> None:
    target = _pod(gate_on, "foreign-0")
    body = er.request_body("other.example.com/drain", target, er.Intent.WITHDRAWN)
    body["metadata"]["name"] = er.request_name(REQUESTER, target.uid)
    code, doc = gate_on.request("POST", f"{BASE}/evictionrequests", body)
    assert code == 201, doc
    with pytest.raises(Conflict) as raised:
        await on.request(target)
    assert "exists for requester 'other.example.com/drain'" in str(raised.value)
    code, doc = gate_on.request("GET", f"{BASE}/evictionrequests/{body['metadata']['name']}")
    assert (code, doc["spec"]["intent"], doc["metadata"]["generation"]) == (200, "Withdrawn", 1)


async def test_the_garbage_collector_removes_a_request_with_its_pod(
    on: er.EvictionRequests, gate_on: kube.KubeServer
) -> None:
    """Should the controller not live to delete its request, the pod's deletion does: the
    request is owned by its pod. kube-controller-manager 1.36 (the suite's; one minor older
    than the server, as Kubernetes supports) runs only its garbage collector, which finds the
    group through discovery."""
    target = _pod(gate_on, "collected-0")
    await on.request(target)
    with control_plane.running(
        gate_on,
        components=["kube-controller-manager"],
        controllers=["garbage-collector-controller"],
    ):
        pod = f"/api/v1/namespaces/{NAMESPACE}/pods/{target.name}"
        code, doc = gate_on.request("DELETE", pod, {"gracePeriodSeconds": 0})
        assert code == 200, doc
        path = f"{BASE}/evictionrequests/{er.request_name(REQUESTER, target.uid)}"
        control_plane.settle(
            "the request is collected", lambda: gate_on.request("GET", path)[0] == 404, 90
        )
    assert await on.state(target) is None


async def test_target_and_requester_are_immutable(gate_on: kube.KubeServer) -> None:
    target = _pod(gate_on, "immutable-0")
    body = er.request_body(REQUESTER, target)
    code, doc = gate_on.request("POST", f"{BASE}/evictionrequests", body)
    assert code == 201, doc
    path = f"{BASE}/evictionrequests/{body['metadata']['name']}"
    for change in (
        {"spec": {"requester": "rebalancer.io/other"}},
        {"spec": {"target": {"pod": {"name": "another", "uid": target.uid}}}},
    ):
        code, doc = gate_on.request("PATCH", path, change, content_type=MERGE)
        assert (code, doc["reason"]) == (422, "Invalid"), doc
        assert "field is immutable" in doc["message"], doc


@pytest.mark.parametrize(
    "prefix",
    [
        "rebalancer.io/",
        "example.com/",
        "sub.k8s.io/",
        "k8s.io/",
        "a.kubernetes.io/",
        "Example.com/",
        "bad_domain/",
    ],
)
def test_the_requester_names_refused_here_are_the_ones_the_server_refuses(
    gate_on: kube.KubeServer, prefix: str
) -> None:
    target = er.Target(NAMESPACE, "any", "3d7fdff1-3fe5-48b9-b106-1ee24b0277f6")
    name = prefix + er.REQUESTER_KEY
    body = er.request_body("x.io/y", target)
    body["spec"]["requester"] = name
    code, doc = gate_on.request("POST", f"{BASE}/evictionrequests?dryRun=All", body)
    try:
        ours = er.requester_name(prefix)
    except ConfigError:
        assert code == 422, doc
    else:
        assert (code, ours) == (201, name), doc


async def test_what_a_responder_reports_is_read(
    on: er.EvictionRequests, gate_on: kube.KubeServer
) -> None:
    target = _pod(gate_on, "responded-0", [{"name": CHECKPOINTER, "priority": 10000}])
    await on.request(target)
    now = datetime.now(UTC).replace(microsecond=0)
    eviction_path = _eviction_as_the_controller_writes_it(gate_on, target, now)
    report = {
        "name": CHECKPOINTER,
        "startTime": _time(now),
        "heartbeatTime": _time(now),
        "expectedCompletionTime": _time(now + timedelta(minutes=4)),
        "message": "saving step 1200",
    }
    _responders(gate_on, eviction_path, report)
    state = await on.state(target)
    assert state is not None
    assert [(r.name, r.state) for r in state.responders] == [
        (CHECKPOINTER, "Active"),
        (EVICTOR, "Inactive"),
    ]
    active = state.active()
    assert active is not None
    assert (active.heartbeat, active.message) == (now, "saving step 1200")
    assert state.expected_by(now) == now + timedelta(minutes=4)
    assert state.expected_by(now + er.HEARTBEAT_DEADLINE + timedelta(seconds=1)) is None
    assert not state.answered()
    # A time in the past is refused: the server holds responders to it.
    past = {**report, "expectedCompletionTime": "2020-01-01T00:00:00Z"}
    code, doc = _responders(gate_on, eviction_path, past, expect=None)
    assert code == 422, doc
    # The responder completes; the controller would then mark it Completed and hand the pod
    # to the default evictor (the server refuses any other next state while a requester asks).
    done = {**report, "completionTime": _time(now)}
    _responders(gate_on, eviction_path, done)
    code, doc = _states(gate_on, eviction_path, done, now, "Canceled", expect=None)
    assert code == 422, doc
    assert "must be one of: Active, because this responder is next in line" in doc["message"]
    _states(gate_on, eviction_path, done, now, "Active")
    handed_over = await on.state(target)
    assert handed_over is not None
    assert [(r.name, r.state) for r in handed_over.responders] == [
        (CHECKPOINTER, "Completed"),
        (EVICTOR, "Active"),
    ]
    assert handed_over.answered()
    assert handed_over.responders[0].completion == now


def _eviction_as_the_controller_writes_it(
    server: kube.KubeServer, target: er.Target, now: datetime
) -> str:
    """What the evictionrequest-controller would write for our request: its
    ``observedGeneration``, the target's Eviction, and a status for that which makes the pod's
    responder active, the default evictor after it. The Eviction's status path."""
    request = f"{BASE}/evictionrequests/{er.request_name(REQUESTER, target.uid)}/status"
    observed = {"status": {"observedGeneration": 1}}
    code, doc = server.request("PATCH", request, observed, content_type=MERGE)
    assert code == 200, doc
    name = f"pod-{target.uid}"
    body = {
        "apiVersion": f"{er.GROUP}/{er.VERSION}",
        "kind": "Eviction",
        "metadata": {"name": name, "labels": {REQUESTER: "requester"}},
        "spec": {"target": {"pod": {"name": target.name, "uid": target.uid}}},
    }
    code, doc = server.request("POST", f"{BASE}/evictions", body)
    assert code == 201, doc
    path = f"{BASE}/evictions/{name}/status"
    status = {
        "observedGeneration": 1,
        "requesters": [{"name": REQUESTER, "intent": "Eviction"}],
        "targetResponders": [
            {"name": CHECKPOINTER, "priority": 10000, "state": "Active"},
            {"name": EVICTOR, "priority": 100, "state": "Inactive"},
        ],
        "responders": [{"name": CHECKPOINTER, "startTime": _time(now)}, {"name": EVICTOR}],
    }
    code, doc = server.request("PATCH", path, {"status": status}, content_type=MERGE)
    assert code == 200, doc
    return path


def _responders(
    server: kube.KubeServer, path: str, report: Obj, expect: int | None = 200
) -> tuple[int, Any]:
    body = {"status": {"responders": [report, {"name": EVICTOR}]}}
    code, doc = server.request("PATCH", path, body, content_type=MERGE)
    if expect is not None:
        assert code == expect, doc
    return code, doc


def _states(
    server: kube.KubeServer,
    path: str,
    done: Obj,
    now: datetime,
    evictor: str,
    expect: int | None = 200,
) -> tuple[int, Any]:
    """The pod's responder Completed (its last report ``done``) and the default evictor in
    state ``evictor`` (started ``now``), as the evictionrequest-controller would move them."""
    body = {
        "status": {
            "targetResponders": [
                {"name": CHECKPOINTER, "priority": 10000, "state": "Completed"},
                {"name": EVICTOR, "priority": 100, "state": evictor},
            ],
            "responders": [
                done,
                {"name": EVICTOR, "startTime": _time(now)},
            ],
        }
    }
    code, doc = server.request("PATCH", path, body, content_type=MERGE)
    if expect is not None:
        assert code == expect, doc
    return code, doc


async def test_without_the_gate_every_call_is_one_line_naming_the_api(
    off: er.EvictionRequests, gate_off: kube.KubeServer
) -> None:
    target = _pod(gate_off, "ungated-0")
    for call in (off.request, off.state, off.withdraw, off.remove):
        with pytest.raises(er.NotServed) as raised:
            await call(target)
        assert str(raised.value) == (
            f"EvictionRequest {NAMESPACE}/{er.request_name(REQUESTER, target.uid)}: 404 the "
            f"cluster serves no {er.GROUP}/{er.VERSION}"
        )


async def test_a_user_no_role_grants_it_gets_the_server_s_refusal(
    gate_on: kube.KubeServer, tmp_path: Path
) -> None:
    target = _pod(gate_on, "forbidden-0")
    config = gate_on.kubeconfig(tmp_path / "kubeconfig", token=kube.CONTROLLER_TOKEN)
    async with kubeclient.api_client(config) as api:
        requests = er.KubeEvictionRequests(api, REQUESTER)
        with pytest.raises(ApiFailure) as raised:
            await requests.request(target)
    assert raised.value.code == 403
    assert str(raised.value).startswith(
        f"EvictionRequest {NAMESPACE}/{er.request_name(REQUESTER, target.uid)}: 403 "
        f'evictionrequests.{er.GROUP} is forbidden: User "{kube.CONTROLLER_USER}"'
    )


# -- The actuator as the requester: a notice files, and a withdrawal withdraws --------------------


def _node(server: kube.KubeServer, name: str) -> None:
    taint = {"key": "workload", "value": "inference", "effect": "NoSchedule"}
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": [taint]},
    }
    code, doc = server.request("POST", "/api/v1/nodes", body)
    assert code == 201, doc


async def _actuator(
    server: kube.KubeServer, tmp_path: Path
) -> AsyncIterator[tuple[Actuator, er.EvictionRequests]]:
    async with kubeclient.api_client(server.kubeconfig(tmp_path / "kubeconfig")) as api:
        requests = er.KubeEvictionRequests(api, REQUESTER)
        writer = KubeWriter(client.CoreV1Api(api), clock=wiring.utc_now)
        yield Actuator(writer, KEYS, SPEC, MARKS, wiring.utc_now, requests=requests), requests


async def test_a_notice_files_a_request_per_pod_and_its_withdrawal_withdraws_it(
    gate_on: kube.KubeServer, tmp_path: Path
) -> None:
    _node(gate_on, "gpu-n1")
    async for act, requests in _actuator(gate_on, tmp_path):
        assert (await act.lend("gpu-n1", "lend-1")).outcome is Outcome.APPLIED
        target = _pod(gate_on, "noticed-0", node="gpu-n1")

        told = await act.notice("gpu-n1", "notice-1", datetime.now(UTC) + timedelta(minutes=5))

        assert told.outcome is Outcome.IN_PROGRESS, told
        filed = [w for w in told.writes if w.kind is WriteKind.REQUEST]
        assert [w.target for w in filed] == [f"evictionrequest/{NAMESPACE}/noticed-0"]
        state = await requests.state(target)
        assert state is not None
        assert state.intent is er.Intent.EVICTION
        assert not state.handled  # 1.37.2 runs nothing that handles it: the deadline holds
        again = await act.progress("gpu-n1")
        assert again.outcome is Outcome.IN_PROGRESS  # not answered by an unhandled request

        withdrawn = await act.withdraw("gpu-n1", "withdraw-1")

        assert withdrawn.outcome is Outcome.APPLIED, withdrawn
        assert WriteKind.REQUEST in [w.kind for w in withdrawn.writes]
        state = await requests.state(target)
        assert state is not None
        assert state.intent is er.Intent.WITHDRAWN


async def test_where_the_api_is_not_served_the_notice_is_the_annotations_alone(
    gate_off: kube.KubeServer, tmp_path: Path
) -> None:
    _node(gate_off, "gpu-n2")
    async for act, _ in _actuator(gate_off, tmp_path):
        assert (await act.lend("gpu-n2", "lend-1")).outcome is Outcome.APPLIED
        _pod(gate_off, "noticed-1", node="gpu-n2")

        told = await act.notice("gpu-n2", "notice-1", datetime.now(UTC) + timedelta(minutes=5))

        assert told.outcome is Outcome.IN_PROGRESS, told
        kinds = [w.kind for w in told.writes]
        assert kinds == [WriteKind.NOTICE, WriteKind.TELL, WriteKind.CONDITION], kinds
        assert "EvictionRequest" not in told.message
