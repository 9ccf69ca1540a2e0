"""The emulator held to kube-apiserver: the same raw requests sent to both, answers compared.

Each case is a short request sequence on fresh objects. What is compared is what the controller
reads: status codes, ``Status`` bodies (kind, status, reason, code, message, details) and the
fields a case names. A difference found here is fixed in the emulator or listed, with its
reason, in ``sandbox/emulator/README.md``'s known differences.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from rebalancer.adapters import writer
from sandbox.emulator.auth import Access, service_account
from sandbox.emulator.server import serve
from sandbox.emulator.store import Store
from tests.support import kube
from tests.support.objects import TAINTS

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STATUS_KEYS = ("kind", "status", "reason", "code", "message", "details")
_names = itertools.count()


@dataclass(frozen=True)
class Step:
    method: str
    path: str
    body: Any = None
    content_type: str = "application/json"
    read: Callable[[Any], Any] | None = None  # the fields compared of a successful answer
    generated: str = ""  # a generateName: the random part of the name it makes is not compared


def node_body(name: str, **labels: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"gpu-pool": "inference", **labels}},
        "spec": {"taints": copy.deepcopy(TAINTS)},
    }


def labels(doc: Any) -> Any:
    return doc["metadata"].get("labels")


def taints(doc: Any) -> Any:
    # The real server adds the not-ready taint to a Node created through the API; the emulator
    # does not (a known difference): compare the taints the requests themselves wrote.
    return [
        t for t in doc["spec"].get("taints") or [] if t["key"] != "node.kubernetes.io/not-ready"
    ]


def names(doc: Any) -> Any:
    return sorted(item["metadata"]["name"] for item in doc["items"])


def answer_of(code: int, doc: Any, step: Step) -> Any:
    """What is compared of one answer."""
    if step.generated:
        chosen = re.escape(step.generated) + "[bcdfghjklmnpqrstvwxz2456789]{5}"
        doc = json.loads(re.sub(chosen, step.generated + "*****", json.dumps(doc)))
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return code, {
            k: _details(doc[k]) if k == "details" else doc.get(k) for k in STATUS_KEYS if k in doc
        }
    return code, step.read(doc) if step.read is not None and code < 300 else None


def _details(details: Any) -> Any:
    """A Status's details, without what differs by nature (a uid, a server's retry hint)."""
    return {k: v for k, v in details.items() if k not in ("uid", "retryAfterSeconds")}


async def on_emulator(steps: list[Step]) -> list[Any]:
    calls = [(s.method, s.path, s.body, s.content_type) for s in steps]
    answers = await kube.ask_emulator(Store(), calls)
    return [answer_of(code, doc, step) for (code, doc), step in zip(answers, steps, strict=True)]


def on_real(real: kube.KubeServer, steps: list[Step]) -> list[Any]:
    out = []
    for step in steps:
        code, doc = real.request(step.method, step.path, step.body, content_type=step.content_type)
        out.append(answer_of(code, doc, step))
    return out


def case_merge_patch_of_labels(n: str) -> list[Step]:
    patch = {"metadata": {"labels": {"added": "yes", "gpu-pool": None}}}
    return [
        Step("POST", "/api/v1/nodes", node_body(n, keep="me"), read=labels),
        Step("PATCH", f"/api/v1/nodes/{n}", patch, MERGE, read=labels),
    ]


def case_strategic_merge_patch_replaces_the_taint_list(n: str) -> list[Step]:
    patch = {
        "spec": {
            "taints": [{"key": "rebalancer.io/lent", "value": "training", "effect": "NoSchedule"}]
        }
    }
    return [
        Step("POST", "/api/v1/nodes", node_body(n), read=taints),
        Step("PATCH", f"/api/v1/nodes/{n}", patch, STRATEGIC, read=taints),
    ]


def case_a_json_patch_whose_test_fails_is_refused(n: str) -> list[Step]:
    ops = [
        {"op": "test", "path": "/metadata/labels/gpu-pool", "value": "training"},
        {"op": "replace", "path": "/metadata/labels/gpu-pool", "value": "lent"},
    ]
    return [
        Step("POST", "/api/v1/nodes", node_body(n), read=labels),
        Step("PATCH", f"/api/v1/nodes/{n}", ops, JSON_PATCH, read=labels),
        Step("GET", f"/api/v1/nodes/{n}", read=labels),
    ]


def case_a_missing_node_is_not_found(n: str) -> list[Step]:
    return [Step("GET", f"/api/v1/nodes/{n}"), Step("DELETE", f"/api/v1/nodes/{n}")]


def case_a_second_create_is_already_exists(n: str) -> list[Step]:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": n, "namespace": "default"},
        "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 15},
    }
    leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    return [
        Step("POST", "/api/v1/nodes", node_body(n), read=labels),
        Step("POST", "/api/v1/nodes", node_body(n)),
        Step("POST", leases, lease, read=lambda d: d["spec"]["holderIdentity"]),
        Step("POST", leases, lease),
    ]


def case_an_update_with_a_stale_resource_version_conflicts(n: str) -> list[Step]:
    stale = node_body(n)
    stale["metadata"]["resourceVersion"] = "1"
    return [
        Step("POST", "/api/v1/nodes", node_body(n), read=labels),
        Step("PUT", f"/api/v1/nodes/{n}", stale),
    ]


def case_label_selectors_choose_nodes(n: str) -> list[Step]:
    return [
        Step("POST", "/api/v1/nodes", node_body(f"{n}-a", batch=n, tier="gold"), read=labels),
        Step("POST", "/api/v1/nodes", node_body(f"{n}-b", batch=n, tier="silver"), read=labels),
        Step("GET", f"/api/v1/nodes?labelSelector=batch%3D{n},tier%3Dgold", read=names),
        Step("GET", f"/api/v1/nodes?labelSelector=batch%3D{n},tier%20notin%20(gold)", read=names),
        Step("GET", f"/api/v1/nodes?labelSelector=batch%3D{n},!tier", read=names),
    ]


def case_field_selectors_choose_pods_by_node(n: str) -> list[Step]:
    def pod(name: str, node: str) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "nginx:1.27"}]},
        }

    pods = "/api/v1/namespaces/default/pods"
    on_node = f"spec.nodeName%3D{n}-node"
    elsewhere = f"spec.nodeName%21%3D{n}-node,metadata.name%3D{n}-b"
    return [
        Step("POST", pods, pod(f"{n}-a", f"{n}-node"), read=lambda d: d["spec"]["nodeName"]),
        Step("POST", pods, pod(f"{n}-b", f"{n}-other"), read=lambda d: d["spec"]["nodeName"]),
        Step("GET", f"{pods}?fieldSelector={on_node}", read=names),
        Step("GET", f"{pods}?fieldSelector={elsewhere}", read=names),
        Step("GET", f"{pods}?fieldSelector={on_node}&labelSelector=app%3Dnone", read=names),
    ]


def case_a_pod_is_marked_disrupted_by_its_uid_and_keeps_its_conditions(n: str) -> list[Step]:
    """What the actuator sends before it deletes a pod at the deadline (``disruption_patch``):
    refused on a pod whose uid is not the one it judged; merged by type with the others."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": n, "namespace": "default"},
        "spec": {"nodeName": f"{n}-node", "containers": [{"name": "main", "image": "nginx:1.27"}]},
    }
    at = datetime(2026, 12, 4, tzinfo=UTC)
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    marked = writer.disruption_patch("not-the-pods-uid", at)
    unchecked = {"status": marked["status"]}
    status = f"/api/v1/namespaces/default/pods/{n}/status"

    def conditions(doc: Any) -> Any:
        found = doc["status"].get("conditions") or []
        return sorted((c["type"], c["status"], c.get("reason")) for c in found)

    return [
        Step("POST", "/api/v1/namespaces/default/pods", pod, read=conditions),
        Step("PATCH", status, ready, STRATEGIC, read=conditions),
        Step("PATCH", status, marked, STRATEGIC, read=conditions),
        Step("PATCH", status, unchecked, STRATEGIC, read=conditions),
    ]


def _bound_pod(n: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": n, "namespace": "default", "annotations": {"example.com/x": "kept"}},
        "spec": {"nodeName": f"{n}-node", "containers": [{"name": "main", "image": "nginx:1.27"}]},
    }


def _annotations(doc: Any) -> Any:
    return doc["metadata"].get("annotations")


def case_a_pods_annotations_are_merged_and_its_uid_is_checked(n: str) -> list[Step]:
    """What a reclaim notice writes on a borrowed pod (``annotations_patch``): refused on a
    pod whose uid is not the one judged, the pod's other annotations kept, ``null`` deleting."""
    pods = "/api/v1/namespaces/default/pods"
    ours = {"rebalancer.io/reclaim-deadline": "2026-12-04T09:35:00Z"}
    unchecked = {"metadata": {"annotations": ours}}
    removed = {"metadata": {"annotations": {"rebalancer.io/reclaim-deadline": None}}}
    return [
        Step("POST", pods, _bound_pod(n), read=_annotations),
        Step("PATCH", f"{pods}/{n}", writer.annotations_patch("not-the-pods-uid", ours), MERGE),
        Step("PATCH", f"{pods}/{n}", unchecked, MERGE, read=_annotations),
        Step("PATCH", f"{pods}/{n}", removed, MERGE, read=_annotations),
        Step("PATCH", f"{pods}/{n}-gone", writer.annotations_patch("u", ours), MERGE),
    ]


def case_a_pods_condition_is_merged_by_type_and_its_type_is_checked(n: str) -> list[Step]:
    """What a reclaim notice writes on a borrowed pod's status (``condition_patch``): merged by
    type with the kubelet's, refused on another pod's uid, a type that is no qualified name
    refused; a merge patch would have replaced the kubelet's conditions."""
    status = f"/api/v1/namespaces/default/pods/{n}/status"
    at = datetime(2026, 12, 4, tzinfo=UTC)
    notice = {
        "type": "rebalancer.io/ReclaimNotice",
        "status": "True",
        "reason": "ReclaimScheduled",
        "message": "reclaim r-1 at 2026-12-04T00:05:00Z",
    }
    kubelet = {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "PodScheduled", "status": "True"},
            ]
        }
    }
    marked = writer.condition_patch("not-the-pods-uid", notice, None, at)
    withdrawn = {**notice, "status": "False", "reason": "ReclaimWithdrawn"}
    unchecked = {"status": writer.condition_patch("u", withdrawn, None, at)["status"]}
    bad_type = {"status": {"conditions": [{"type": "not a type!", "status": "True"}]}}

    def conditions(doc: Any) -> Any:
        found = doc["status"].get("conditions") or []
        return [
            (c["type"], c["status"], c.get("reason"), c.get("lastTransitionTime")) for c in found
        ]

    return [
        Step("POST", "/api/v1/namespaces/default/pods", _bound_pod(n), read=conditions),
        Step("PATCH", status, kubelet, STRATEGIC, read=conditions),
        Step("PATCH", status, marked, STRATEGIC, read=conditions),
        Step("PATCH", status, {"status": marked["status"]}, STRATEGIC, read=conditions),
        Step("PATCH", status, unchecked, STRATEGIC, read=conditions),
        Step("PATCH", status, bad_type, STRATEGIC),
        Step("PATCH", status, unchecked, MERGE, read=conditions),
        Step("PATCH", f"/api/v1/namespaces/default/pods/{n}-gone/status", marked, STRATEGIC),
    ]


def case_a_changed_uid_is_named_twice_but_on_budgets(n: str) -> list[Step]:
    """kube-apiserver checks an object's metadata twice on an update, and names each cause
    twice, for every kind the controller writes but PodDisruptionBudgets."""
    other = {"metadata": {"uid": "not-the-uid"}}
    budgets = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": n, "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"job-name": n}}},
    }
    return [
        Step("POST", "/api/v1/nodes", node_body(n), read=labels),
        Step("PATCH", f"/api/v1/nodes/{n}", other, MERGE),
        Step("PATCH", f"/api/v1/nodes/{n}/status", other, MERGE),
        Step("POST", budgets, budget, read=lambda d: d["spec"]),
        Step("PATCH", f"{budgets}/{n}", other, MERGE),
    ]


def case_a_lease_update_names_the_version_it_read(n: str) -> list[Step]:
    leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    lease: Obj = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": n, "namespace": "default"},
        "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 15, "leaseTransitions": 0},
    }

    def taken_at(version: str | None) -> Obj:
        body = copy.deepcopy(lease)
        if version is not None:
            body["metadata"]["resourceVersion"] = version
        body["spec"] = {**body["spec"], "holderIdentity": "replica-b", "leaseTransitions": 1}
        return body

    return [
        Step("POST", leases, lease, read=lambda d: d["spec"]["holderIdentity"]),
        # The elector's compare-and-swap: an update carries the version it read. None, or "0"
        # (read as the number 0), is refused as unset; an older one is a conflict.
        Step("PUT", f"{leases}/{n}", taken_at(None)),
        Step("PUT", f"{leases}/{n}", taken_at("0")),
        Step("PUT", f"{leases}/{n}", taken_at("1")),
    ]


def case_an_event_is_created_as_events_k8s_io_v1(n: str) -> list[Step]:
    event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{n}.1", "namespace": "default"},
        "eventTime": "2026-03-02T12:00:00.000000Z",
        "reportingController": "rebalancer.io/rebalancer",
        "reportingInstance": "rebalancer-0",
        "action": "Lend",
        "reason": "Lent",
        "note": "lent to training",
        "type": "Normal",
        "regarding": {"kind": "Node", "name": n, "apiVersion": "v1"},
    }
    events = "/apis/events.k8s.io/v1/namespaces/default/events"
    fields = ("reason", "note", "type", "action", "reportingController", "regarding")
    return [
        Step("POST", events, event, read=lambda d: {k: d.get(k) for k in fields}),
        Step("POST", events, {**event, "type": "Sideways"}),
        Step(
            "POST",
            events,
            {**event, "metadata": {"name": f"{n}.2", "namespace": "default"}, "eventTime": None},
        ),
        # A generated name's prefix must be a name itself, but for a trailing dash.
        Step("POST", events, generated(event, f"{n}."), generated=f"{n}."),
        Step(
            "POST",
            events,
            generated(event, f"{n}-"),
            read=lambda d: d["metadata"]["name"],
            generated=f"{n}-",
        ),
    ]


def case_a_streamed_list_is_asked_for_as_the_informer_asks(n: str) -> list[Step]:
    """``sendInitialEvents`` only on a watch, and only with ``resourceVersionMatch=NotOlderThan``:
    what the informer's streamed list must send, and what a server that refuses it answers."""
    one = f"fieldSelector=metadata.name%3D{n}&timeoutSeconds=1"
    return [
        Step("POST", "/api/v1/nodes", node_body(n), read=labels),
        Step("GET", f"/api/v1/nodes?watch=true&sendInitialEvents=true&{one}"),
        Step(
            "GET",
            f"/api/v1/nodes?watch=true&sendInitialEvents=true&resourceVersionMatch=Exact&{one}",
        ),
        Step(
            "GET", f"/api/v1/nodes?sendInitialEvents=true&resourceVersionMatch=NotOlderThan&{one}"
        ),
        Step("GET", f"/api/v1/nodes?sendInitialEvents=true&{one}"),
    ]


def generated(body: Obj, prefix: str) -> Obj:
    return {**body, "metadata": {"generateName": prefix, "namespace": "default"}}


CASES = [
    case_merge_patch_of_labels,
    case_strategic_merge_patch_replaces_the_taint_list,
    case_a_json_patch_whose_test_fails_is_refused,
    case_a_missing_node_is_not_found,
    case_a_second_create_is_already_exists,
    case_an_update_with_a_stale_resource_version_conflicts,
    case_label_selectors_choose_nodes,
    case_field_selectors_choose_pods_by_node,
    case_a_lease_update_names_the_version_it_read,
    case_an_event_is_created_as_events_k8s_io_v1,
    case_a_pod_is_marked_disrupted_by_its_uid_and_keeps_its_conditions,
    case_a_pods_annotations_are_merged_and_its_uid_is_checked,
    case_a_pods_condition_is_merged_by_type_and_its_type_is_checked,
    case_a_changed_uid_is_named_twice_but_on_budgets,
    case_a_streamed_list_is_asked_for_as_the_informer_asks,
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__.removeprefix("case_"))
async def test_the_emulator_answers_as_kube_apiserver_does(
    real: kube.KubeServer, case: Callable[[str], list[Step]]
) -> None:
    name = f"conformance-{next(_names)}"
    steps = case(name)
    real_answers = on_real(real, steps)
    emulated = await on_emulator(steps)
    for step, want, got in zip(steps, real_answers, emulated, strict=True):
        assert got == want, f"{step.method} {step.path}: emulator {got}, kube-apiserver {want}"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/nodes"),
        ("GET", "/api/v1/namespaces/training/pods"),
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases"),
    ],
)
async def test_an_rbac_denial_reads_the_same_on_both_servers(
    real: kube.KubeServer, method: str, path: str
) -> None:
    """The controller's user with no role bound, as before the chart's RBAC is applied."""
    body = None if method == "GET" else {"metadata": {"name": "denied"}}
    code, want = real.request(method, path, body, token=kube.CONTROLLER_TOKEN)
    namespace, name = kube.CONTROLLER_USER.split(":")[2:]
    access = Access({kube.CONTROLLER_TOKEN: service_account(namespace, name)})
    call = (method, path, body, "application/json")
    (got,) = await kube.ask_emulator(Store(), [call], access, kube.CONTROLLER_TOKEN)
    assert code == 403
    assert answer_of(*got, Step(method, path)) == answer_of(code, want, Step(method, path))


# ---------------------------------------------------------------------------------------------
# Watches: the stream's events, read until the server ends it (``timeoutSeconds``)


def _events(raw: bytes) -> list[Any]:
    """What is compared of a watch stream: each event's type and, for an object, its name and
    labels; for an ERROR, its Status's code and reason."""
    out = []
    for line in raw.splitlines():
        event = json.loads(line)
        obj = event["object"]
        if event["type"] == "ERROR":
            out.append(("ERROR", obj.get("code"), obj.get("reason")))
        elif event["type"] == "BOOKMARK":
            out.append(("BOOKMARK", obj["kind"], obj["metadata"].get("annotations")))
        else:
            out.append((event["type"], obj["metadata"]["name"], obj["metadata"].get("labels")))
    return out


async def test_a_watch_resumes_from_a_version_and_ends_at_its_timeout_on_both_servers(
    real: kube.KubeServer,
) -> None:
    name = f"conformance-watch-{next(_names)}"
    merge = {"metadata": {"labels": {"rack": "r2"}}}
    nodes = "/api/v1/nodes"

    def watch_path(version: str) -> str:
        return (
            f"{nodes}?watch=true&resourceVersion={version}&timeoutSeconds=2"
            f"&fieldSelector=metadata.name%3D{name}"
        )

    # kube-apiserver: create, remember the version, change it, watch from the version.
    code, made = real.request("POST", nodes, node_body(name))
    assert code == 201
    version = made["metadata"]["resourceVersion"]
    assert real.request("PATCH", f"{nodes}/{name}", merge, content_type=MERGE)[0] == 200
    real_code, real_raw = real.raw("GET", watch_path(version))
    # The emulator, the same requests.
    async with serve(Store()) as url, aiohttp.ClientSession() as session:
        async with session.post(url + nodes, json=node_body(name)) as answer:
            emulated_version = (await answer.json())["metadata"]["resourceVersion"]
        headers = {"Content-Type": MERGE}
        patch = session.patch(f"{url}{nodes}/{name}", data=json.dumps(merge), headers=headers)
        async with patch as answer:
            assert answer.status == 200
        async with session.get(url + watch_path(emulated_version)) as answer:
            emulated_code, emulated_raw = answer.status, await answer.read()
    assert (real_code, emulated_code) == (200, 200)
    assert _events(emulated_raw) == _events(real_raw)
    assert _events(real_raw) == [("MODIFIED", name, {"gpu-pool": "inference", "rack": "r2"})]


async def test_a_streamed_list_sends_the_objects_then_the_bookmark_that_ends_it_on_both_servers(
    real: kube.KubeServer,
) -> None:
    """The informer's list as a stream: every object as ADDED, then a bookmark annotated as the
    list's end, then the watch goes on (here: to its timeout)."""
    name = f"conformance-stream-{next(_names)}"
    path = (
        "/api/v1/nodes?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        f"&allowWatchBookmarks=true&timeoutSeconds=2&fieldSelector=metadata.name%3D{name}"
    )
    assert real.request("POST", "/api/v1/nodes", node_body(name))[0] == 201
    real_code, real_raw = real.raw("GET", path)
    async with serve(Store()) as url, aiohttp.ClientSession() as session:
        async with session.post(url + "/api/v1/nodes", json=node_body(name)) as answer:
            assert answer.status == 201
        async with session.get(url + path) as answer:
            emulated_code, emulated_raw = answer.status, await answer.read()
    assert (real_code, emulated_code) == (200, 200)
    assert _events(emulated_raw) == _events(real_raw)
    assert _events(real_raw) == [
        ("ADDED", name, {"gpu-pool": "inference"}),
        ("BOOKMARK", "Node", {"k8s.io/initial-events-end": "true"}),
    ]
