"""Server-side printing: objects as ``meta.k8s.io/v1`` ``Table`` rows, for ``kubectl get``.

``kubectl get`` asks for ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and prints the
columns the server chose, so the columns of ``kubectl get nodes`` (``STATUS``, ``ROLES``,
``AGE``, ``VERSION``) are the server's, not kubectl's. kube-apiserver computes them with the
printers of ``pkg/printers/internalversion``, always in their wide form (``-o wide`` only shows
the columns of priority 1); this module ports the printers of the kinds the emulator serves
(Node, Pod, Event in both API groups, PodDisruptionBudget, Lease, ServiceAccount and the two
RBAC bindings) and gives every other kind the default ``Name``/``Created At`` table, as the real
server does for kinds without a printer (ClusterRole, Role).

Ages are measured on the emulator's clock, the one every other time in the sandbox is read
from, where the real server reads its wall clock. Each row carries the object as
``includeObject`` asks (``Metadata``, the default: a ``PartialObjectMetadata``, from which
``kubectl get -L`` reads labels; ``Object``; ``None``). In a watch, only the first event's table
has the column definitions, as on the real server.

Not ported: init containers in the pod's status column (the emulator's kubelet runs none), and a
column's long description (the real ones are the OpenAPI field docs; these are one line).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sandbox.emulator import conversion, resources
from sandbox.emulator.clock import parse_rfc3339
from sandbox.emulator.resources import ResourceType

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    description: str
    priority: int = 0  # 1: shown by ``-o wide`` only
    type: str = "string"
    format: str = ""

    def definition(self) -> Obj:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


Cells = Callable[[Obj, datetime], list[Any]]

_NAME = Column("Name", "Name must be unique within a namespace.", format="name")
_AGE = Column("Age", "CreationTimestamp is the server time when this object was created.")
_CREATED = Column("Created At", _AGE.description, type="date")
_INCLUDE = ("None", "Metadata", "Object")


def include_object(query: Any) -> str:
    """``includeObject``: what each row carries (``Metadata`` unless it names another)."""
    value = str(query.get("includeObject") or "")
    return value if value in _INCLUDE else "Metadata"


def table(
    rt: ResourceType,
    objects: Sequence[Obj],
    now: datetime,
    *,
    metadata: Obj,
    version: str = "v1",
    include: str = "Metadata",
    headers: bool = True,
) -> Obj:
    """``objects`` (stored form) as one ``Table``; ``headers=False`` leaves the column
    definitions out (every watch event after the first)."""
    columns, cells = _printer(rt)
    rows = []
    for obj in objects:
        row: Obj = {"cells": cells(obj, now)}
        if include == "Metadata":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": f"meta.k8s.io/{version}",
                "metadata": obj.get("metadata") or {},
            }
        elif include == "Object":
            row["object"] = conversion.from_storage(rt, obj)
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": metadata,
        "columnDefinitions": [c.definition() for c in columns] if headers else [],
        "rows": rows,
    }


def _printer(rt: ResourceType) -> tuple[tuple[Column, ...], Cells]:
    return _PRINTERS.get((rt.group, rt.plural), (_DEFAULT, _default))


# ---------------------------------------------------------------------------------------------
# Printers, after pkg/printers/internalversion/printers.go


def human_duration(seconds: float) -> str:
    """``duration.HumanDuration``: ``45s``, ``3m20s``, ``4h5m``, ``2d3h``, ``1y20d``..."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        return f"{minutes}m" if whole % 60 == 0 else f"{minutes}m{whole % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d" if hours % 24 == 0 else f"{days}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    years = days // 365
    if hours < 24 * 365 * 8:
        return f"{years}y" if days % 365 == 0 else f"{years}y{days % 365}d"
    return f"{years}y"


def _since(stamp: Any, now: datetime) -> str:
    """``translateTimestampSince``: ``<unknown>`` for a missing time."""
    if not stamp:
        return "<unknown>"
    return human_duration((now - parse_rfc3339(str(stamp))).total_seconds())


def _age(obj: Obj, now: datetime) -> str:
    return _since((obj.get("metadata") or {}).get("creationTimestamp"), now)


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _or(value: Any, default: str) -> str:
    return str(value) if value else default


_DEFAULT = (_NAME, _CREATED)


def _default(obj: Obj, _: datetime) -> list[Any]:
    return [_name(obj), (obj.get("metadata") or {}).get("creationTimestamp")]


_NODE = (
    _NAME,
    Column("Status", "The status of the node"),
    Column("Roles", "The roles of the node"),
    _AGE,
    Column("Version", "Kubelet Version reported by the node."),
    Column("Internal-IP", "List of addresses reachable to the node.", 1),
    Column("External-IP", "List of addresses reachable to the node.", 1),
    Column("OS-Image", "OS Image reported by the node from /etc/os-release.", 1),
    Column("Kernel-Version", "Kernel Version reported by the node from 'uname -r'.", 1),
    Column("Container-Runtime", "ContainerRuntime Version reported by the node.", 1),
)


def _node(obj: Obj, now: datetime) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    shown = ["Ready" if ready[-1].get("status") == "True" else "NotReady"] if ready else []
    if not shown:
        shown = ["Unknown"]
    if spec.get("unschedulable"):
        shown.append("SchedulingDisabled")
    roles = set()
    for key, value in ((obj.get("metadata") or {}).get("labels") or {}).items():
        if key.startswith("node-role.kubernetes.io/") and key != "node-role.kubernetes.io/":
            roles.add(key.removeprefix("node-role.kubernetes.io/"))
        elif key == "kubernetes.io/role" and value:
            roles.add(value)
    info = status.get("nodeInfo") or {}
    kernel = _or(info.get("kernelVersion"), "<unknown>")
    if info.get("architecture"):
        kernel += f" ({info['architecture']})"
    return [
        _name(obj),
        ",".join(shown),
        ",".join(sorted(roles)) or "<none>",
        _age(obj, now),
        info.get("kubeletVersion", ""),
        _address(status, "InternalIP"),
        _address(status, "ExternalIP"),
        _or(info.get("osImage"), "<unknown>"),
        kernel,
        _or(info.get("containerRuntimeVersion"), "<unknown>"),
    ]


def _address(status: Obj, kind: str) -> str:
    for address in status.get("addresses") or []:
        if address.get("type") == kind:
            return str(address.get("address", ""))
    return "<none>"


_POD = (
    _NAME,
    Column("Ready", "The aggregate readiness state of this pod for accepting traffic."),
    Column("Status", "The aggregate status of the containers in this pod."),
    Column("Restarts", "The number of times the containers in this pod have been restarted."),
    _AGE,
    Column("IP", "podIP address allocated to the pod.", 1),
    Column("Node", "NodeName indicates in which node this pod is scheduled.", 1),
    Column("Nominated Node", "nominatedNodeName is set when this pod preempts others.", 1),
    Column("Readiness Gates", "The readiness gates of this pod, met of all.", 1),
)


def _pod(obj: Obj, now: datetime) -> list[Any]:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    phase = str(status.get("phase") or "")
    reason = str(status.get("reason") or phase)
    conditions = status.get("conditions") or []
    if any(
        c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated" for c in conditions
    ):
        reason = "SchedulingGated"
    restarts = ready = 0
    last_restart = ""
    running, error_reason = False, ""
    for container in reversed(status.get("containerStatuses") or []):
        restarts += int(container.get("restartCount") or 0)
        finished = ((container.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
        if finished and (not last_restart or parse_rfc3339(finished) > parse_rfc3339(last_restart)):
            last_restart = finished
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated")
        if waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated is not None:
            code = int(terminated.get("exitCode") or 0)
            if terminated.get("reason"):
                reason = terminated["reason"]
            elif terminated.get("signal"):
                reason = f"Signal:{terminated['signal']}"
            else:
                reason = f"ExitCode:{code}"
            if code != 0:
                error_reason = reason
        elif container.get("ready") and state.get("running") is not None:
            running = True
            ready += 1
    if reason == "Completed":
        pod_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if running and pod_ready:
            reason = "Running"
        elif error_reason:
            reason = error_reason
        elif running:
            reason = "NotReady"
    if meta.get("deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif phase not in ("Succeeded", "Failed"):
            reason = "Terminating"
    shown_restarts = str(restarts)
    if restarts and last_restart:
        shown_restarts = f"{restarts} ({_since(last_restart, now)} ago)"
    gates = spec.get("readinessGates") or []
    met = sum(
        1
        for gate in gates
        for c in conditions
        if c.get("type") == gate.get("conditionType") and c.get("status") == "True"
    )
    ips = status.get("podIPs") or []
    return [
        _name(obj),
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        shown_restarts,
        _age(obj, now),
        _or(ips[0].get("ip") if ips else "", "<none>"),
        _or(spec.get("nodeName"), "<none>"),
        _or(status.get("nominatedNodeName"), "<none>"),
        f"{met}/{len(gates)}" if gates else "<none>",
    ]


_EVENT = (
    Column("Last Seen", "The time at which the most recent occurrence of this event was recorded."),
    Column("Type", "Type of this event (Normal, Warning)."),
    Column("Reason", "Why the object moved into its current status, in one word."),
    Column("Object", "The object that this event is about."),
    Column("Subobject", "The part of the object the event is about, such as a container.", 1),
    Column("Source", "The component reporting this event.", 1),
    Column("Message", "A human-readable description of the status of this operation."),
    Column("First Seen", "The time at which the event was first recorded.", 1),
    Column("Count", "The number of times this event has occurred.", 1),
    Column("Name", _NAME.description, 1, format="name"),
)


def _event(obj: Obj, now: datetime) -> list[Any]:
    """``printEvent`` on the stored (core/v1) form, which both API groups print alike."""
    first = _since(obj.get("firstTimestamp"), now)
    if not obj.get("firstTimestamp"):
        first = _since(obj.get("eventTime"), now)
    last = _since(obj.get("lastTimestamp"), now) if obj.get("lastTimestamp") else first
    count = int(obj.get("count") or 0)
    series = obj.get("series")
    if series is not None:
        last = _since(series.get("lastObservedTime"), now)
        count = int(series.get("count") or 0)
    elif count == 0:
        count = 1  # a singleton event has no count in events.k8s.io/v1
    involved = obj.get("involvedObject") or {}
    kind = str(involved.get("kind", "")).lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = obj.get("source") or {}
    component = source.get("component") or obj.get("reportingComponent") or ""
    instance = source.get("host") or obj.get("reportingInstance") or ""
    return [
        last,
        obj.get("type", ""),
        obj.get("reason", ""),
        target,
        involved.get("fieldPath", ""),
        f"{component}, {instance}" if instance else component,
        str(obj.get("message") or "").strip(),
        first,
        count,
        _name(obj),
    ]


_PDB = (
    _NAME,
    Column("Min Available", "The minimum number of pods that must be available."),
    Column("Max Unavailable", "The maximum number of pods that may be unavailable."),
    Column("Allowed Disruptions", "Number of pods that may be disrupted now.", type="integer"),
    _AGE,
)


def _pdb(obj: Obj, now: datetime) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    least, most = spec.get("minAvailable"), spec.get("maxUnavailable")
    return [
        _name(obj),
        "N/A" if least is None else str(least),
        "N/A" if most is None else str(most),
        int(status.get("disruptionsAllowed") or 0),
        _age(obj, now),
    ]


_LEASE = (_NAME, Column("Holder", "holderIdentity: the current holder of the lease."), _AGE)


def _lease(obj: Obj, now: datetime) -> list[Any]:
    holder = (obj.get("spec") or {}).get("holderIdentity") or ""
    return [_name(obj), holder, _age(obj, now)]


def _named(obj: Obj, now: datetime) -> list[Any]:
    return [_name(obj), _age(obj, now)]


_BINDING = (
    _NAME,
    Column("Role", "RoleRef references the role bound."),
    _AGE,
    Column("Users", "Users bound.", 1),
    Column("Groups", "Groups bound.", 1),
    Column("ServiceAccounts", "ServiceAccounts bound.", 1),
)


def _binding(obj: Obj, now: datetime) -> list[Any]:
    """``printRoleBinding``; subjects as ``rbac.SubjectsStrings`` joins them."""
    ref = obj.get("roleRef") or {}
    users, groups, accounts = [], [], []
    for subject in obj.get("subjects") or []:
        kind, name = subject.get("kind"), str(subject.get("name", ""))
        if kind == "User":
            users.append(name)
        elif kind == "Group":
            groups.append(name)
        elif kind == "ServiceAccount":
            accounts.append(f"{subject.get('namespace', '')}/{name}")
    return [
        _name(obj),
        f"{ref.get('kind', '')}/{ref.get('name', '')}",
        _age(obj, now),
        ", ".join(users),
        ", ".join(groups),
        ", ".join(accounts),
    ]


_PRINTERS: dict[tuple[str, str], tuple[tuple[Column, ...], Cells]] = {
    ("", "nodes"): (_NODE, _node),
    ("", "pods"): (_POD, _pod),
    ("", "events"): (_EVENT, _event),
    ("events.k8s.io", "events"): (_EVENT, _event),
    ("policy", "poddisruptionbudgets"): (_PDB, _pdb),
    ("coordination.k8s.io", "leases"): (_LEASE, _lease),
    ("", "serviceaccounts"): ((_NAME, _AGE), _named),
    (resources.RBAC_GROUP, "rolebindings"): (_BINDING, _binding),
    (resources.RBAC_GROUP, "clusterrolebindings"): (_BINDING, _binding),
}
