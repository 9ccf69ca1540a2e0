"""The resource types the emulator serves, and what the server knows about each.

A ``ResourceType`` is one REST endpoint family (``/api/v1/namespaces/{ns}/pods``...) with the
facts of its registry in kube-apiserver: whether it has a ``status`` subresource (then the main
endpoint ignores status changes), whether it counts ``metadata.generation``, whether deletion is
graceful (pods), what DELETE answers (pods return the object, others a ``Status``), whether PUT
may create or may omit ``resourceVersion`` (Leases may not), and which fields a
``fieldSelector`` may name. ``core/v1`` Events and ``events.k8s.io/v1`` Events are two views of
one stored collection, as in the real server: ``storage`` names the collection. ServiceAccounts
and the four ``rbac.authorization.k8s.io/v1`` kinds are stored like any other object; ``rbac.py``
reads them to authorize requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    storage: str
    status_subresource: bool = False
    generation: bool = False
    graceful: bool = False
    return_deleted: bool = False
    create_on_update: bool = False
    unconditional_update: bool = True
    fields: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The group an Invalid answer names, when it is not the resource's own: events.k8s.io/v1
    # Events are validated as the core Events they are stored as (``Event "x" is invalid``).
    validated_as: str | None = None
    # What discovery lists for kubectl: ``kubectl get no``, ``kubectl get all``.
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()

    @property
    def invalid_group(self) -> str:
        return self.group if self.validated_as is None else self.validated_as

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    def field_values(self, obj: Obj) -> dict[str, str]:
        """The values a field selector compares, read from the stored object."""
        return {name: _text(_dig(obj, path)) for name, path in self.fields.items()}


def _dig(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_META = {"metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace")}

_POD_FIELDS = {
    **_META,
    "spec.nodeName": ("spec", "nodeName"),
    "spec.restartPolicy": ("spec", "restartPolicy"),
    "spec.schedulerName": ("spec", "schedulerName"),
    "spec.serviceAccountName": ("spec", "serviceAccountName"),
    "spec.hostNetwork": ("spec", "hostNetwork"),
    "status.phase": ("status", "phase"),
    "status.podIP": ("status", "podIP"),
    "status.nominatedNodeName": ("status", "nominatedNodeName"),
}

_EVENT_OBJECT = ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")

_CORE_EVENT_FIELDS = {
    **_META,
    **{f"involvedObject.{f}": ("involvedObject", f) for f in _EVENT_OBJECT},
    "reason": ("reason",),
    "reportingComponent": ("reportingComponent",),
    "source": ("source", "component"),
    "type": ("type",),
}

# events.k8s.io/v1 names the same stored fields differently; the selector reads the stored form.
_V1_EVENT_FIELDS = {
    **_META,
    **{f"regarding.{f}": ("involvedObject", f) for f in _EVENT_OBJECT},
    "reason": ("reason",),
    "reportingController": ("reportingComponent",),
    "type": ("type",),
}

NODES = ResourceType(
    group="",
    version="v1",
    plural="nodes",
    kind="Node",
    namespaced=False,
    storage="nodes",
    status_subresource=True,
    fields={"metadata.name": ("metadata", "name"), "spec.unschedulable": ("spec", "unschedulable")},
    short_names=("no",),
)
PODS = ResourceType(
    group="",
    version="v1",
    plural="pods",
    kind="Pod",
    namespaced=True,
    storage="pods",
    status_subresource=True,
    generation=True,
    graceful=True,
    return_deleted=True,
    fields=_POD_FIELDS,
    short_names=("po",),
    categories=("all",),
)
PDBS = ResourceType(
    group="policy",
    version="v1",
    plural="poddisruptionbudgets",
    kind="PodDisruptionBudget",
    namespaced=True,
    storage="poddisruptionbudgets",
    status_subresource=True,
    generation=True,
    fields=_META,
    short_names=("pdb",),
)
LEASES = ResourceType(
    group="coordination.k8s.io",
    version="v1",
    plural="leases",
    kind="Lease",
    namespaced=True,
    storage="leases",
    create_on_update=True,
    unconditional_update=False,
    fields=_META,
)
CORE_EVENTS = ResourceType(
    group="",
    version="v1",
    plural="events",
    kind="Event",
    namespaced=True,
    storage="events",
    create_on_update=True,
    fields=_CORE_EVENT_FIELDS,
    short_names=("ev",),
)
EVENTS = ResourceType(
    group="events.k8s.io",
    version="v1",
    plural="events",
    kind="Event",
    namespaced=True,
    storage="events",
    create_on_update=True,
    fields=_V1_EVENT_FIELDS,
    validated_as="",
    short_names=("ev",),
)

SERVICEACCOUNTS = ResourceType(
    group="",
    version="v1",
    plural="serviceaccounts",
    kind="ServiceAccount",
    namespaced=True,
    storage="serviceaccounts",
    fields=_META,
    short_names=("sa",),
)


def _rbac(plural: str, kind: str, namespaced: bool) -> ResourceType:
    return ResourceType(
        group=RBAC_GROUP,
        version="v1",
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        storage=plural,
        fields=_META,
    )


RBAC_GROUP = "rbac.authorization.k8s.io"
CLUSTERROLES = _rbac("clusterroles", "ClusterRole", namespaced=False)
CLUSTERROLEBINDINGS = _rbac("clusterrolebindings", "ClusterRoleBinding", namespaced=False)
ROLES = _rbac("roles", "Role", namespaced=True)
ROLEBINDINGS = _rbac("rolebindings", "RoleBinding", namespaced=True)
RBAC = (CLUSTERROLES, CLUSTERROLEBINDINGS, ROLES, ROLEBINDINGS)

ALL = (NODES, PODS, PDBS, LEASES, CORE_EVENTS, EVENTS, SERVICEACCOUNTS, *RBAC)
BY_PATH = {(rt.group, rt.version, rt.plural): rt for rt in ALL}


def find(group: str, version: str, plural: str) -> ResourceType | None:
    return BY_PATH.get((group, version, plural))
