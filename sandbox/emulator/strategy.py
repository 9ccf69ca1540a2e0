"""What the server does to an object of each kind before storing it (a registry "strategy").

On create: a fresh ``uid``, ``creationTimestamp`` and ``generation``; a Pod is defaulted as the
defaulting code and the default admission plugins would (``Pending`` phase, QoS class,
``schedulerName``, a 30 s grace period, ``priority: 0``, the two 300 s ``NoExecute`` tolerations,
container requests copied from limits); a PodDisruptionBudget starts with an empty status.
On update: ``uid``, ``creationTimestamp``, ``deletionTimestamp`` and ``generation`` cannot be
changed by the client; where a ``status`` subresource exists the main endpoint keeps the old
status and the status endpoint keeps the old spec; ``generation`` moves when the spec changes.
``normalize`` then drops what the server's Go types would not echo back (``null`` members, an
empty taint value, empty label maps), so a client reads back what a real server returns.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from typing import Any

from sandbox.emulator import validation
from sandbox.emulator.clock import rfc3339
from sandbox.emulator.resources import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    CORE_EVENTS,
    EVENTS,
    NODES,
    PDBS,
    PODS,
    RBAC,
    ROLEBINDINGS,
    ROLES,
    ResourceType,
)
from sandbox.emulator.status import Cause

Obj = dict[str, Any]

DEFAULT_TOLERATIONS = (
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
)


def prepare_create(rt: ResourceType, obj: Obj, now: datetime, uid: str) -> Obj:
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
        meta.pop(key, None)
    meta["uid"] = uid
    meta["creationTimestamp"] = rfc3339(now)
    if rt.generation:
        meta["generation"] = 1
    else:
        meta.pop("generation", None)
    if rt is PODS:
        _default_pod(obj)
    elif rt is PDBS:
        obj["status"] = {
            "disruptionsAllowed": 0,
            "currentHealthy": 0,
            "desiredHealthy": 0,
            "expectedPods": 0,
        }
    return normalize(obj)


def prepare_update(rt: ResourceType, new: Obj, old: Obj, subresource: str | None) -> Obj:
    new = copy.deepcopy(new)
    meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
    if not meta.get("uid"):
        meta["uid"] = old_meta["uid"]
    meta["creationTimestamp"] = old_meta["creationTimestamp"]
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        if key in old_meta:
            meta[key] = old_meta[key]
        else:
            meta.pop(key, None)
    meta.pop("generation", None)
    if rt.generation:
        meta["generation"] = old_meta.get("generation", 1)
    if subresource == "status":
        new["spec"] = copy.deepcopy(old.get("spec"))
        if rt is PODS:
            meta["ownerReferences"] = copy.deepcopy(old_meta.get("ownerReferences"))
    elif rt.status_subresource:
        new["status"] = copy.deepcopy(old.get("status"))
    if rt is PODS:
        _default_pod_spec(new.setdefault("spec", {}))
    new = normalize(new)
    if rt.generation and _spec(new) != _spec(normalize(old)):
        new["metadata"]["generation"] = old_meta.get("generation", 1) + 1
    return new


def _spec(obj: Obj) -> str:
    return json.dumps(obj.get("spec"), sort_keys=True)


def validate_create(rt: ResourceType, obj: Obj) -> list[Cause]:
    meta = obj.get("metadata") or {}
    causes = validation.labels(meta) + validation.annotation_keys(meta)
    if rt is CORE_EVENTS:
        return validation.event(obj, strict=False) + causes
    if rt is EVENTS:
        return validation.event(obj, strict=True) + causes
    if rt in RBAC:
        return validation.path_segment_name(meta) + causes + _kind_rules(rt, obj)
    causes = validation.name(meta) + causes
    return causes + _kind_rules(rt, obj)


def validate_update(rt: ResourceType, new: Obj, old: Obj) -> list[Cause]:
    meta = new.get("metadata") or {}
    causes = validation.metadata_update(meta, old.get("metadata") or {})
    if rt not in _METADATA_CHECKED_ONCE:
        # kube-apiserver checks an object's metadata twice on an update (the kind's own update
        # validation, then the registry's common one) and names every cause twice, on the main
        # endpoint and on status alike: seen on v1.36.3 for a changed uid and for a finalizer
        # added to a deleting object.
        causes += validation.metadata_update(meta, old.get("metadata") or {})
    causes += validation.labels(meta) + validation.annotation_keys(meta)
    if rt in (CORE_EVENTS, EVENTS):
        return causes + validation.event(new, strict=False)
    causes += _kind_rules(rt, new)
    if rt is PODS:
        causes += validation.pod_spec_update(new.get("spec") or {}, old.get("spec") or {})
        causes += validation.pod_conditions(new.get("status"))
    if rt in (CLUSTERROLEBINDINGS, ROLEBINDINGS):
        causes += validation.role_ref_update(new, old)
    return causes


# The kinds whose own update validation leaves the metadata to the common one (v1.36.3).
_METADATA_CHECKED_ONCE = (PDBS, CORE_EVENTS)


def _kind_rules(rt: ResourceType, obj: Obj) -> list[Cause]:
    spec = obj.get("spec") or {}
    if rt is NODES:
        return validation.taints(spec.get("taints"))
    if rt is PODS:
        return validation.pod_spec(spec)
    if rt is PDBS:
        return validation.budget(spec)
    if rt in (CLUSTERROLES, ROLES):
        return validation.policy_rules(obj.get("rules"), namespaced=rt is ROLES)
    if rt in (CLUSTERROLEBINDINGS, ROLEBINDINGS):
        return validation.binding(obj, cluster=rt is CLUSTERROLEBINDINGS)
    return []


# ---------------------------------------------------------------------------------------------
# Pod defaults


def _default_pod(pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    _default_pod_spec(spec)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    for default in DEFAULT_TOLERATIONS:
        if not any(_tolerates_key(t, default) for t in tolerations):
            tolerations.append(dict(default))
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}


def _tolerates_key(toleration: Obj, default: Obj) -> bool:
    key_ok = not toleration.get("key") or toleration.get("key") == default["key"]
    effect_ok = not toleration.get("effect") or toleration.get("effect") == "NoExecute"
    return key_ok and effect_ok and toleration.get("operator") == "Exists"


def _default_pod_spec(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or []:
            _default_container(container)


def _default_container(container: Obj) -> None:
    image = str(container.get("image", ""))
    tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
    default_policy = "Always" if tag in ("", "latest") and "@" not in image else "IfNotPresent"
    container.setdefault("imagePullPolicy", default_policy)
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    resources = container.setdefault("resources", {})
    limits = resources.get("limits") or {}
    if limits:
        requests = resources.setdefault("requests", {})
        for key, value in limits.items():
            requests.setdefault(key, value)


def qos_class(spec: Obj) -> str:
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    requests = [c.get("resources", {}).get("requests") or {} for c in containers]
    limits = [c.get("resources", {}).get("limits") or {} for c in containers]
    if not any(requests) and not any(limits):
        return "BestEffort"
    guaranteed = all(
        all(
            lim.get(r) is not None and req.get(r, lim.get(r)) == lim.get(r)
            for r in ("cpu", "memory")
        )
        for req, lim in zip(requests, limits, strict=True)
    )
    return "Guaranteed" if guaranteed else "Burstable"


# ---------------------------------------------------------------------------------------------
# What the Go types echo back


def normalize(obj: Obj) -> Obj:
    obj = _drop_nulls(obj)
    meta = obj.get("metadata") or {}
    for key in ("labels", "annotations", "finalizers", "ownerReferences"):
        if key in meta and not meta[key]:
            del meta[key]
    spec = obj.get("spec")
    if isinstance(spec, dict):
        if "taints" in spec and not spec["taints"]:
            del spec["taints"]
        for taint in spec.get("taints") or []:
            if taint.get("value") == "":
                del taint["value"]
        for toleration in spec.get("tolerations") or []:
            for key in ("key", "operator", "value", "effect"):
                if toleration.get(key) == "":
                    del toleration[key]
        if spec.get("unschedulable") is False:
            del spec["unschedulable"]
    return obj


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value
