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

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

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


def _ready(node: Object) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return _condition(node, "Ready")  # a node that never reported Ready is not one to lend


def finished(pod: Object) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_view(pod: Object, rules: model.PodRules) -> model.PodView:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    return model.PodView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        role=role(pod, rules),
        priority=int(spec.get("priority") or 0),
        job=job_of(pod),
        created=_time(meta.get("creationTimestamp")),
        terminating=meta.get("deletionTimestamp") is not None,
        ready=_condition(pod, "Ready"),
    )


def _condition(obj: Object, kind: str) -> bool:
    """Whether the object's ``status.conditions`` say ``kind`` is True (absent: False)."""
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return bool(condition.get("status") == "True")
    return False


def role(pod: Object, rules: model.PodRules) -> model.PodRole:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or ()):
        return model.PodRole.DAEMON
    tolerations = spec.get("tolerations") or ()
    if any(tolerates(tolerations, taint) for taint in rules.lend_taints):
        return model.PodRole.BORROWED
    labels = meta.get("labels") or {}
    selected = bool(rules.inference_selector) and all(
        labels.get(k) == v for k, v in rules.inference_selector.items()
    )
    if selected or any(tolerates(tolerations, taint) for taint in rules.serving_taints):
        return model.PodRole.INFERENCE
    return model.PodRole.OTHER


def tolerates(tolerations: Iterable[Object], taint: model.Taint) -> bool:
    """Kubernetes' toleration matching (k8s.io/api/core/v1 ToleratesTaint)."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists":
            if not key or key == taint.key:
                return True
        elif (
            operator == "Equal"
            and key == taint.key
            and (toleration.get("value") or "") == (taint.value or "")
        ):
            return True
    return False


def job_of(pod: Object) -> str | None:
    """The training job a pod belongs to: a job label, else its controller; None if neither."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    namespace = meta.get("namespace", "")
    for label in JOB_LABELS:
        if labels.get(label):
            return f"{namespace}/{labels[label]}"
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return f"{namespace}/{ref.get('kind')}/{ref.get('name')}"
    return None


def _time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
