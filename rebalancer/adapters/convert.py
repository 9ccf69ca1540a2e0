"""Kubernetes objects, as the API server sends them (JSON dicts), into the core's values.

Where it sits: the informer feeds watched Nodes and Pods through here to build ``NodeView``s;
the actuator uses it to re-read a node before each write. Pure functions: no client, no I/O.

A pod's role decides whether its node is idle:
- a pod owned by a DaemonSet does not make a node busy;
- a pod that tolerates the lend taint is borrowed training (the opt-in DESIGN section 1 asks of
  preemptible training), the only kind the actuator ever evicts;
- a pod matching the pool's inference selector, or tolerating one of the taints the pool serves
  under, is inference: its node is never lent;
- anything else makes the node not idle.
Pods that have finished (``Succeeded``/``Failed``) hold nothing and are left out.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from rebalancer.core import model

# Labels that name the training job a pod belongs to, most specific first.
JOB_LABELS = (
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "volcano.sh/job-name",
    "batch.kubernetes.io/job-name",
    "job-name",
)

Object = Mapping[str, Any]
T = TypeVar("T")


def taints(node: Object) -> tuple[model.Taint, ...]:
    """The node's taints in API order, each field kept as written."""
    return tuple(
        model.Taint(
            key=str(t.get("key", "")),
            effect=str(t.get("effect", "")),
            value=t.get("value"),
            time_added=t.get("timeAdded"),
        )
        for t in (node.get("spec") or {}).get("taints") or ()
    )


def node_view(node: Object, pods: Sequence[model.PodView] = ()) -> model.NodeView:
    meta = node.get("metadata") or {}
    return model.NodeView(
        name=model.NodeName(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        taints=taints(node),
        annotations=dict(meta.get("annotations") or {}),
        pods=tuple(pods),
        ready=_ready(node),
        resource_version=str(meta.get("resourceVersion", "")),
    )


def slim_node(node: Object) -> dict[str, Any]:
    """What the controller keeps of a Node: the fields ``node_view`` and the informer's change
    detection read, as received (labels and taints in the server's order), without the images,
    capacity, addresses and managed fields that make up most of a node's JSON."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    conditions = (node.get("status") or {}).get("conditions") or ()
    kept: dict[str, Any] = {
        "metadata": {k: meta[k] for k in _NODE_METADATA if k in meta},
        "spec": {k: spec[k] for k in ("taints", "unschedulable") if k in spec},
    }
    if isinstance(conditions, list):
        ready = [c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"]
        kept["status"] = {"conditions": ready}
    return kept


_NODE_METADATA = ("name", "uid", "resourceVersion", "labels", "annotations")


def _ready(node: Object) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return _condition(node, "Ready")  # a node that never reported Ready is not one to lend


def finished(pod: Object) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


# ---------------------------------------------------------------------------------------------
# Pods: what the controller keeps of one (the cache holds 150,000 of them), then its role


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str  # "Equal" or "Exists"
    value: str
    effect: str  # "" tolerates every effect


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The fields of a Pod that any pool's rules read, and nothing else: about a tenth of the
    memory of the parsed JSON (docs/design/informer.md). Repeated values (namespaces, node
    names, label keys and values, tolerations, controllers, job names) are shared
    between records, not copied."""

    namespace: str
    name: str
    node: str
    resource_version: str
    labels: Mapping[str, str]
    tolerations: tuple[Toleration, ...]
    daemon: bool  # owned by a DaemonSet
    controller: str | None  # "Kind/name" of its controller, if any
    priority: int
    created: datetime | None
    terminating: bool
    ready: bool


class _Shared:
    """One copy of each value many pods repeat. Bounded: past ``limit`` distinct values it
    starts again, which costs memory, never correctness."""

    def __init__(self, limit: int = 200_000) -> None:
        self._values: dict[object, object] = {}
        self._limit = limit

    def __call__(self, value: T) -> T:
        return value if value is None else self.find(value, lambda: value)

    def find(self, key: Hashable, make: Callable[[], T]) -> T:
        """The value kept for ``key``, made by ``make`` the first time."""
        found = self._values.get(key)
        if found is None:
            if len(self._values) >= self._limit:
                self._values.clear()
            found = self._values[key] = make()
        return cast(T, found)  # each key's maker gives one type: the caller's


_shared = _Shared()


def pod_record(pod: Object) -> PodRecord:
    """What the controller keeps of a pod. Raises (``ValueError``, ``TypeError``,
    ``AttributeError``) on a pod it cannot read; the caller names the pod."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    owners = meta.get("ownerReferences") or ()
    controller = next(
        (f"{ref.get('kind')}/{ref.get('name')}" for ref in owners if ref.get("controller")), None
    )
    labels = meta.get("labels") or {}
    return PodRecord(
        namespace=sys.intern(str(meta.get("namespace", ""))),
        name=str(meta.get("name", "")),
        node=sys.intern(str(spec.get("nodeName") or "")),
        resource_version=str(meta.get("resourceVersion", "")),
        labels={sys.intern(str(k)): sys.intern(str(v)) for k, v in labels.items()},
        tolerations=_tolerations(spec.get("tolerations") or ()),
        daemon=any(ref.get("kind") == "DaemonSet" for ref in owners),
        controller=None if controller is None else _shared(controller),
        priority=int(spec.get("priority") or 0),
        created=_time(meta.get("creationTimestamp")),
        terminating=meta.get("deletionTimestamp") is not None,
        ready=_condition(pod, "Ready"),
    )


def _tolerations(raw: Sequence[Object]) -> tuple[Toleration, ...]:
    """The pod's tolerations, found by their fields as sent: the pods of one workload share
    one tuple, and building it is the dearest part of reading a pod (a sync of 150,000)."""
    fields = tuple((t.get("key"), t.get("operator"), t.get("value"), t.get("effect")) for t in raw)
    return _shared.find(fields, lambda: tuple(_toleration(t) for t in raw))


def _toleration(raw: Object) -> Toleration:
    return _shared(
        Toleration(
            key=str(raw.get("key") or ""),
            operator=str(raw.get("operator") or "Equal"),
            value=str(raw.get("value") or ""),
            effect=str(raw.get("effect") or ""),
        )
    )


def pod_view(pod: Object | PodRecord, rules: model.PodRules) -> model.PodView:
    record = pod if isinstance(pod, PodRecord) else pod_record(pod)
    return model.PodView(
        namespace=record.namespace,
        name=record.name,
        role=role(record, rules),
        priority=record.priority,
        job=job_of(record),
        created=record.created,
        terminating=record.terminating,
        ready=record.ready,
    )


def _condition(obj: Object, kind: str) -> bool:
    """Whether the object's ``status.conditions`` say ``kind`` is True (absent: False)."""
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return bool(condition.get("status") == "True")
    return False


def role(pod: Object | PodRecord, rules: model.PodRules) -> model.PodRole:
    record = pod if isinstance(pod, PodRecord) else pod_record(pod)
    if record.daemon:
        return model.PodRole.DAEMON
    tolerations = record.tolerations
    if any(tolerates(tolerations, taint) for taint in rules.lend_taints):
        return model.PodRole.BORROWED
    labels = record.labels
    selected = bool(rules.inference_selector) and all(
        labels.get(k) == v for k, v in rules.inference_selector.items()
    )
    if selected or any(tolerates(tolerations, taint) for taint in rules.serving_taints):
        return model.PodRole.INFERENCE
    return model.PodRole.OTHER


def tolerates(tolerations: Iterable[Toleration | Object], taint: model.Taint) -> bool:
    """Kubernetes' toleration matching (k8s.io/api/core/v1 ToleratesTaint)."""
    for toleration in tolerations:
        t = toleration if isinstance(toleration, Toleration) else _toleration(toleration)
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists":
            if not t.key or t.key == taint.key:
                return True
        elif t.operator == "Equal" and t.key == taint.key and t.value == (taint.value or ""):
            return True
    return False


def job_of(pod: Object | PodRecord) -> str | None:
    """The training job a pod belongs to: a job label, else its controller; None if neither."""
    record = pod if isinstance(pod, PodRecord) else pod_record(pod)
    for label in JOB_LABELS:
        if record.labels.get(label):
            return _shared(f"{record.namespace}/{record.labels[label]}")
    if record.controller is not None:
        return _shared(f"{record.namespace}/{record.controller}")
    return None


def _time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
