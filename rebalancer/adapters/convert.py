"""Kubernetes objects, as the API server sends them (JSON dicts), into the core's values.

Where it sits: the informer feeds watched Nodes and Pods through here to build ``NodeView``s;
the actuator uses it to re-read a node before each write. Pure functions: no client, no I/O.

A pod's role decides whether its node is idle:
- a pod owned by a DaemonSet does not make a node busy;
- a pod that tolerates the lend taint is borrowed training (the opt-in docs/training-jobs.md asks of
  preemptible training), the only kind the actuator ever evicts;
- a pod matching the pool's inference selector, or tolerating one of the taints the pool serves
  under, is inference: its node is never lent;
- anything else makes the node not idle.
Pods that have finished (``Succeeded``/``Failed``) hold nothing and are left out.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar, cast

import orjson

from rebalancer.core import bounded, model, nodestate

# Labels that name the training job a pod belongs to, most specific first: a pod group (Kueue's
# plain pods, the scheduler-plugins' coscheduling) before the workload that made it.
JOB_LABELS = (
    "kueue.x-k8s.io/pod-group-name",
    "scheduling.x-k8s.io/pod-group",
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "volcano.sh/job-name",
    "batch.kubernetes.io/job-name",
    "job-name",
)

# Volcano names a pod's PodGroup in an annotation, not a label.
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
# When a pod last saved, as Volcano's convention says it; ours (``Keys.last_checkpoint``) first.
VOLCANO_CHECKPOINT = "volcano.sh/last-checkpoint-time"
PREFIX = nodestate.Keys().prefix  # the controller's key prefix unless it is configured otherwise
GPU = "nvidia.com/gpu"

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
        allocatable=_allocatable(node),
        uid=str(meta.get("uid") or ""),
        created=time_of(meta.get("creationTimestamp")),
    )


def _allocatable(node: Object) -> model.Resources | None:
    """What the node offers pods; None when it does not say (or says it unreadably): no taker
    can then be shown to fit, so nothing is lent for one."""
    raw = (node.get("status") or {}).get("allocatable")
    if not isinstance(raw, Mapping):
        return None
    try:
        return _resources(raw)
    except ValueError:
        return None


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
    status: dict[str, Any] = {}
    if isinstance(conditions, list):
        ready = [c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"]
        status["conditions"] = ready
    allocatable = (node.get("status") or {}).get("allocatable")
    if isinstance(allocatable, dict):
        status["allocatable"] = {k: allocatable[k] for k in _PLACED_BY if k in allocatable}
    if status:
        kept["status"] = status
    return kept


_NODE_METADATA = ("name", "uid", "creationTimestamp", "resourceVersion", "labels", "annotations")
_PLACED_BY = (GPU, "cpu", "memory")  # the resources a taker is placed by


# ---------------------------------------------------------------------------------------------
# Quantities: what a pod requests and a node offers


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?")


def quantity(value: object) -> Decimal:
    """A resource quantity (``500m``, ``8``, ``16Gi``, ``1e3``) as an exact decimal; raises
    ``ValueError`` naming the value for anything the API would not have accepted."""
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    match = _QUANTITY.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"{value!r} is not a resource quantity such as 500m, 8 or 16Gi")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        base = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only numbers
        raise ValueError(f"{value!r} is not a resource quantity") from exc
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    exponent = int(suffix[1:]) if suffix[:1] in ("e", "E") else _DECIMAL[suffix]
    return base.scaleb(exponent)


def _resources(raw: Mapping[str, Any]) -> model.Resources:
    """GPUs, millicores and bytes, each rounded up: a request is never read as less. Read
    once per distinct set of quantities as the API writes them (strings): the pods of a
    workload all ask the same, and parsing each quantity was a third of reading a pod."""
    key = (raw.get(GPU, "0"), raw.get("cpu", "0"), raw.get("memory", "0"))
    if all(type(q) is str for q in key):
        return _shared.find(("resources", *key), lambda: _read_resources(raw))
    return _read_resources(raw)


def _read_resources(raw: Mapping[str, Any]) -> model.Resources:
    return model.Resources(
        gpu=math.ceil(quantity(raw.get(GPU, 0))),
        cpu=math.ceil(quantity(raw.get("cpu", 0)) * 1000),
        memory=math.ceil(quantity(raw.get("memory", 0))),
    )


def requests(spec: Object) -> model.Resources:
    """What a pod asks of its node, as the scheduler counts it (``resourcehelper.PodRequests``):
    the sum of its containers' requests and its sidecars' (init containers that keep running:
    ``restartPolicy: Always``), or what its init containers need at their peak where that is
    more (each in turn, beside the sidecars started before it); the pod-level requests
    (``spec.resources``) instead for the CPU and memory they name; plus its overhead. A limit
    stands in for a missing request (the API defaults it so). Raises ``ValueError``."""
    total = sum((_container(c) for c in spec.get("containers") or ()), model.NOTHING)
    sidecars = peak = model.NOTHING
    for init in spec.get("initContainers") or ():
        need = _container(init)
        if init.get("restartPolicy") == "Always":
            total, sidecars = total + need, sidecars + need
            need = sidecars
        else:
            need = need + sidecars
        peak = _most(peak, need)
    total = _most(total, peak)
    pod_level = _container(spec)  # the same fields: ``resources.requests``, else its limits
    total = model.Resources(
        gpu=total.gpu,
        cpu=pod_level.cpu if _names(spec, "cpu") else total.cpu,
        memory=pod_level.memory if _names(spec, "memory") else total.memory,
    )
    overhead = spec.get("overhead")
    return total + _resources(overhead) if isinstance(overhead, Mapping) else total


def _most(a: model.Resources, b: model.Resources) -> model.Resources:
    return model.Resources(max(a.gpu, b.gpu), max(a.cpu, b.cpu), max(a.memory, b.memory))


def _names(spec: Object, resource: str) -> bool:
    """Whether the pod-level resources (``spec.resources``) name ``resource``."""
    resources = spec.get("resources") or {}
    return any(resource in (resources.get(k) or {}) for k in ("requests", "limits"))


def _container(container: Object) -> model.Resources:
    resources = container.get("resources") or {}
    wanted = dict(resources.get("limits") or {})
    wanted.update(resources.get("requests") or {})
    return _resources(wanted)


def _ready(node: Object) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return _condition(node, "Ready")  # a node that never reported Ready is not one to lend


def finished(pod: Object) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


# ---------------------------------------------------------------------------------------------
# Pods: what the controller keeps of one (the cache holds 150,000 of them), then its role


Toleration = model.Toleration


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The fields of a Pod that any pool's marks read, and nothing else: about a tenth of the
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
    requests: model.Resources
    group: str | None  # the Volcano PodGroup it belongs to (``GROUP_ANNOTATION``)
    bound: datetime | None  # ``bound_time``: the same object as ``created`` when it is that
    said: Said | None  # what it says of its work; None for a pod that says nothing (most)


@dataclass(frozen=True, slots=True)
class Said:
    """What a pod says of its own work by annotation (``said``): when it last saved (None
    when it does not say, or says it in a way not believed), the reclaim id it has saved
    for, and why its checkpoint is not believed. One object, held only by the records of
    pods that say any of it, so that the record of every other pod grows by one empty slot."""

    checkpointed: datetime | None = None
    acked: str | None = None
    unbelieved: model.Unbelieved | None = None


_SAYS_NOTHING = Said()


def said(annotations: Mapping[str, Any], created: datetime | None, prefix: str) -> Said | None:
    """What a pod's annotations say of its work, under the controller's ``prefix``; None when
    they say nothing (absent or empty values). The checkpoint is ``<prefix>last-checkpoint-time``
    where it is given, else ``volcano.sh/last-checkpoint-time``: ours wins, and is not passed
    over for Volcano's when it is not believed (a job that writes ours means it). Never raises:
    a checkpoint that is not an RFC 3339 time with a zone, or is before the pod was created,
    is not believed (``Said.unbelieved`` says which key, which value and why)."""
    keys = _keys(prefix)
    ack = _text(annotations.get(keys.reclaim_ack))
    ours = keys.last_checkpoint
    key = ours if _text(annotations.get(ours)) else VOLCANO_CHECKPOINT
    text = _text(annotations.get(key))
    if text is None and ack is None:
        return None
    # An id is short: a long value is kept cut (bounded in the record), and matches no reclaim.
    acked = None if ack is None else bounded.cut(ack)
    if text is None:
        return Said(acked=acked)
    when = nodestate.parse_time(text)
    if isinstance(when, str):
        return Said(acked=acked, unbelieved=model.Unbelieved(key, text, when))
    if created is not None and created.tzinfo is not None and when < created:
        why = (
            f"it is before the pod was created ({nodestate.format_time(created)}): a pod "
            "cannot have saved before it existed"
        )
        return Said(acked=acked, unbelieved=model.Unbelieved(key, text, why))
    return Said(when, acked)


@functools.cache
def _keys(prefix: str) -> nodestate.Keys:
    """The key names under ``prefix``, made once per prefix, not once per pod."""
    return nodestate.Keys(prefix)


def _text(value: object) -> str | None:
    """An annotation's value; None when it is absent or empty (a pod that says nothing)."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None


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


def pod_record(pod: Object, prefix: str = PREFIX) -> PodRecord:
    """What the controller keeps of a pod, its own annotations read under the controller's key
    ``prefix``. Raises (``ValueError``, ``TypeError``, ``AttributeError``) on a pod it cannot
    read; the caller names the pod. An annotation it does not believe is no such error
    (``said``): the pod is read, and the annotation reported."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    owners = meta.get("ownerReferences") or ()
    controller = next(
        (f"{ref.get('kind')}/{ref.get('name')}" for ref in owners if ref.get("controller")), None
    )
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    created = time_of(meta.get("creationTimestamp"))
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
        created=created,
        terminating=meta.get("deletionTimestamp") is not None,
        ready=_condition(pod, "Ready"),
        requests=_requests_of(spec),
        group=_shared(annotations.get(GROUP_ANNOTATION) or None),
        bound=_scheduled(pod) or created,
        said=said(annotations, created, prefix),
    )


def bound_time(pod: Object) -> datetime | None:
    """When the pod was bound to its node: its PodScheduled condition's time (the API
    server's clock, as the node's ``creationTimestamp`` is), else its creation (a pod created
    with ``spec.nodeName``). Whole seconds, as the API writes them."""
    return _scheduled(pod) or time_of((pod.get("metadata") or {}).get("creationTimestamp"))


def _scheduled(pod: Object) -> datetime | None:
    return next(
        (
            time_of(c.get("lastTransitionTime"))
            for c in (pod.get("status") or {}).get("conditions") or ()
            if c.get("type") == "PodScheduled" and c.get("status") == "True"
        ),
        None,
    )


def _requests_of(spec: Object) -> model.Resources:
    """``requests(spec)``, worked out once per distinct set of what it reads (the containers'
    and init containers' resources, the sidecars' restart policy, the pod's own resources and
    overhead), found by that set as JSON: the pods of a workload ask alike, and summing each
    pod's containers again was the dearest part of reading a pod. A spec that cannot be written
    so is read directly, and raises as ``requests`` does."""
    try:
        key = orjson.dumps(
            (
                [c.get("resources") for c in spec.get("containers") or ()],
                [
                    (c.get("resources"), c.get("restartPolicy"))
                    for c in spec.get("initContainers") or ()
                ],
                spec.get("resources"),
                spec.get("overhead"),
            )
        )
    except (TypeError, AttributeError, orjson.JSONEncodeError):
        return _shared(requests(spec))
    return _shared.find(("requests", key), lambda: _shared(requests(spec)))


def _tolerations(raw: Sequence[Object]) -> tuple[Toleration, ...]:
    """The pod's tolerations, found by their fields as sent: the pods of one workload share
    one tuple, and building it is the dearest part of reading a pod (a sync of 150,000)."""
    try:
        key: Hashable = ("tolerations", orjson.dumps(raw))  # one call in C, not a tuple a field
    except TypeError:
        key = tuple((t.get("key"), t.get("operator"), t.get("value"), t.get("effect")) for t in raw)
    return _shared.find(key, lambda: tuple(_toleration(t) for t in raw))


def _toleration(raw: Object) -> Toleration:
    return _shared(
        Toleration(
            key=str(raw.get("key") or ""),
            operator=str(raw.get("operator") or "Equal"),
            value=str(raw.get("value") or ""),
            effect=str(raw.get("effect") or ""),
        )
    )


def pod_view(pod: Object | PodRecord, marks: model.PodMarks) -> model.PodView:
    """The pod as the core sees it under a pool's ``marks``; a pod as the API sends it is read
    under ``marks.prefix`` (a record was read under the informer's, the same setting)."""
    record = pod if isinstance(pod, PodRecord) else pod_record(pod, marks.prefix)
    says = record.said or _SAYS_NOTHING
    return model.PodView(
        namespace=record.namespace,
        name=record.name,
        role=role(record, marks),
        priority=record.priority,
        job=job_of(record),
        created=record.created,
        terminating=record.terminating,
        ready=record.ready,
        requests=record.requests,
        bound=record.bound,
        checkpointed=says.checkpointed,
        acked=says.acked,
        unbelieved=says.unbelieved,
    )


def pending_pod(pod: Object | PodRecord, spec: Object) -> model.PendingPod:
    """A pod waiting for a node, as a possible taker of lent capacity: its ``spec`` gives what
    the scheduler places it by (``nodeSelector``, the required node affinity). Raises
    (``ValueError``, ``TypeError``, ``AttributeError``) on a pod it cannot read."""
    record = pod if isinstance(pod, PodRecord) else pod_record(pod)
    selector = spec.get("nodeSelector") or {}
    return model.PendingPod(
        namespace=record.namespace,
        name=record.name,
        tolerations=record.tolerations,
        requests=record.requests,
        node_selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
        affinity=_required_affinity(spec),
        job=job_of(record),
        priority=record.priority,
        created=record.created,
    )


def _required_affinity(spec: Object) -> tuple[tuple[model.Requirement, ...], ...]:
    """The required node affinity's terms; a ``matchFields`` entry (only ``metadata.name``
    exists) becomes a requirement on ``takers.NODE_NAME_FIELD``, matched against the node's
    name, never against a label."""
    node = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = []
    for term in required.get("nodeSelectorTerms") or ():
        expressions = [
            *((str(e["key"]), e) for e in term.get("matchExpressions") or ()),
            *((f"field:{e['key']}", e) for e in term.get("matchFields") or ()),
        ]
        terms.append(
            tuple(
                model.Requirement(
                    key=key,
                    operator=str(e["operator"]),
                    values=tuple(str(v) for v in e.get("values") or ()),
                )
                for key, e in expressions
            )
        )
    return tuple(terms)


def _condition(obj: Object, kind: str) -> bool:
    """Whether the object's ``status.conditions`` say ``kind`` is True (absent: False)."""
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return bool(condition.get("status") == "True")
    return False


def role(pod: Object | PodRecord, marks: model.PodMarks) -> model.PodRole:
    record = pod if isinstance(pod, PodRecord) else pod_record(pod)
    if record.daemon:
        return model.PodRole.DAEMON
    tolerations = record.tolerations
    if any(model.tolerates(tolerations, taint) for taint in marks.lend_taints):
        return model.PodRole.BORROWED
    labels = record.labels
    selected = bool(marks.inference_selector) and all(
        labels.get(k) == v for k, v in marks.inference_selector.items()
    )
    if selected or any(model.tolerates(tolerations, taint) for taint in marks.serving_taints):
        return model.PodRole.INFERENCE
    return model.PodRole.OTHER


def tolerates(tolerations: Iterable[Toleration | Object], taint: model.Taint) -> bool:
    """Kubernetes' toleration matching, for tolerations as cached or as the API sends them."""
    read = (t if isinstance(t, Toleration) else _toleration(t) for t in tolerations)
    return model.tolerates(read, taint)


def job_of(pod: Object | PodRecord) -> str | None:
    """The training job a pod belongs to: its pod group, a job label, else its controller;
    None if none."""
    record = pod if isinstance(pod, PodRecord) else pod_record(pod)
    if record.group:
        return _shared(f"{record.namespace}/{record.group}")
    for label in JOB_LABELS:
        if record.labels.get(label):
            return _shared(f"{record.namespace}/{record.labels[label]}")
    if record.controller is not None:
        return _shared(f"{record.namespace}/{record.controller}")
    return None


def time_of(text: object) -> datetime | None:
    """An API time (RFC 3339) as read, or None when it is absent or not one. One object per
    distinct time (the API writes whole seconds: the pods created in a second share it)."""
    if not isinstance(text, str):
        return None
    return _shared.find(("time", text), lambda: _parsed_time(text))


def _parsed_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# Kueue Workloads: the takers of a job Kueue holds back, before it has made any pod
# (docs/design/takers.md#kueue-workloads)

# The version read: Kueue v0.17.0 stores and prefers v1beta2 (it serves v1beta1 too).
KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOADS = "kueue.x-k8s.io", "v1beta2", "workloads"
KUEUE_CRD = f"{KUEUE_WORKLOADS}.{KUEUE_GROUP}"


def workload_waits(workload: Object) -> bool:
    """Whether a Kueue Workload waits for quota: not admitted (no ``status.admission``), not
    finished, not deactivated (``spec.active: false``) and not being deleted. A Workload of
    plain pods (owned by Pods) never waits here: its pods exist already, held by a scheduling
    gate, and are pending pods of their own."""
    meta, spec = workload.get("metadata") or {}, workload.get("spec") or {}
    if meta.get("deletionTimestamp") is not None or spec.get("active") is False:
        return False
    if (workload.get("status") or {}).get("admission") or _condition(workload, "Finished"):
        return False
    return not any(ref.get("kind") == "Pod" for ref in meta.get("ownerReferences") or ())


def workload_takers(workload: Object) -> tuple[model.PendingPod, ...]:
    """The pods a waiting Workload's job would run, as pending pods: each ``spec.podSets[]``
    entry's ``count`` pods of its ``template``, all of one job (the Workload's
    ``namespace/name``: a gang), with the Workload's ``spec.priority`` where it has one (else
    the template's) and its creation time. Named ``<workload>/<podset>-<i>``. Empty for one
    that does not wait (``workload_waits``). Raises (``ValueError``, ``TypeError``,
    ``AttributeError``, ``KeyError``) on one it cannot read."""
    if not workload_waits(workload):
        return ()
    meta, spec = workload.get("metadata") or {}, workload.get("spec") or {}
    namespace, name = sys.intern(str(meta.get("namespace", ""))), str(meta["name"])
    job = _shared(f"{namespace}/{name}")
    created = time_of(meta.get("creationTimestamp"))
    priority = spec.get("priority")
    out: list[model.PendingPod] = []
    for i, podset in enumerate(spec.get("podSets") or ()):
        count = int(podset.get("count", 1))
        if count < 0:
            raise ValueError(f"podSets[{i}].count is {count}")
        pod = (podset.get("template") or {}).get("spec") or {}
        selector = pod.get("nodeSelector") or {}
        one = model.PendingPod(
            namespace=namespace,
            name="",
            tolerations=_tolerations(pod.get("tolerations") or ()),
            requests=_shared(requests(pod)),
            node_selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
            affinity=_required_affinity(pod),
            job=job,
            priority=int(pod.get("priority") or 0) if priority is None else int(priority),
            created=created,
        )
        label = str(podset.get("name") or i)
        out.extend(replace(one, name=f"{name}/{label}-{k}") for k in range(count))
    return tuple(out)
