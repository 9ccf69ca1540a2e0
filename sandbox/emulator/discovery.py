"""Discovery: the documents that tell a client which resources the server has.

``kubectl`` reads them before anything else, to turn ``kubectl get no`` into
``GET /api/v1/nodes``. kube-apiserver serves discovery in two forms, chosen by the ``Accept``
header: the aggregated form (``apidiscovery.k8s.io/v2`` ``APIGroupDiscoveryList``, every group's
resources in two answers, from ``/api`` and ``/apis``), which kubectl asks for first, and the
legacy form (``APIVersions`` at ``/api``, ``APIGroupList`` at ``/apis``, an ``APIGroup`` at
``/apis/{group}`` and an ``APIResourceList`` at ``/api/v1`` and ``/apis/{group}/{version}``).

Both are generated from ``resources.ALL``, so discovery lists exactly what the emulator serves,
with the verbs it answers (no ``deletecollection``, which it does not emulate) and the
subresources it routes (``status``, ``pods/eviction``). Shapes, field names and the order of the
groups were read off kube-apiserver v1.36.3; ``storageVersionHash`` is left out (it is optional
and only storage migration reads it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sandbox.emulator import resources
from sandbox.emulator.resources import PODS, ResourceType

Obj = dict[str, Any]

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList"
VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")
_STATUS_VERBS = ("get", "patch", "update")
# kube-apiserver lists groups by priority; these are the emulator's in that order.
_GROUP_ORDER = ("events.k8s.io", "policy", "rbac.authorization.k8s.io", "coordination.k8s.io")


def groups() -> list[str]:
    """The named API groups served, in the order discovery lists them."""
    served = {rt.group for rt in resources.ALL if rt.group}
    return [g for g in _GROUP_ORDER if g in served] + sorted(served - set(_GROUP_ORDER))


def versions(group: str) -> list[str]:
    return sorted({rt.version for rt in resources.ALL if rt.group == group})


def _served(group: str, version: str) -> list[ResourceType]:
    found = [rt for rt in resources.ALL if rt.group == group and rt.version == version]
    return sorted(found, key=lambda rt: rt.plural)


# ---------------------------------------------------------------------------------------------
# Legacy


def api_versions(server_address: str) -> Obj:
    """``GET /api``: the core group's versions."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def api_group(group: str) -> Obj:
    """``GET /apis/{group}``."""
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions(group)]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": listed,
        "preferredVersion": listed[0],
    }


def api_group_list() -> Obj:
    """``GET /apis``."""
    items = []
    for group in groups():
        body = api_group(group)
        del body["kind"], body["apiVersion"]
        items.append(body)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": items}


def api_resource_list(group: str, version: str) -> Obj | None:
    """``GET /api/v1`` or ``/apis/{group}/{version}``; ``None`` for a version not served."""
    served = _served(group, version)
    if not served:
        return None
    listed: list[Obj] = []
    for rt in served:
        main: Obj = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(VERBS),
        }
        if rt.short_names:
            main["shortNames"] = list(rt.short_names)
        if rt.categories:
            main["categories"] = list(rt.categories)
        listed.append(main)
        for sub in _subresources(rt):
            entry: Obj = {
                "name": f"{rt.plural}/{sub['subresource']}",
                "singularName": "",
                "namespaced": rt.namespaced,
            }
            kind = sub["responseKind"]
            if kind["group"] or kind["version"]:
                entry["group"], entry["version"] = kind["group"], kind["version"]
            entry["kind"], entry["verbs"] = kind["kind"], sub["verbs"]
            listed.append(entry)
    body: Obj = {"kind": "APIResourceList"}
    if group:  # the real /api/v1 has no apiVersion; the groups' lists do
        body["apiVersion"] = "v1"
    body["groupVersion"] = f"{group}/{version}" if group else version
    body["resources"] = listed
    return body


# ---------------------------------------------------------------------------------------------
# Aggregated


def aggregated(core: bool, version: str = "v2") -> Obj:
    """``GET /api`` (``core``) or ``/apis`` as an ``APIGroupDiscoveryList``."""
    items: list[Obj]
    if core:
        items = [{"metadata": {}, "versions": [_version_discovery("", "v1")]}]
    else:
        items = [
            {
                "metadata": {"name": group},
                "versions": [_version_discovery(group, v) for v in versions(group)],
            }
            for group in groups()
        ]
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": f"apidiscovery.k8s.io/{version}",
        "metadata": {},
        "items": items,
    }


def _version_discovery(group: str, version: str) -> Obj:
    listed = []
    for rt in _served(group, version):
        entry: Obj = {
            "resource": rt.plural,
            "responseKind": {"group": "", "version": "", "kind": rt.kind},
            "scope": "Namespaced" if rt.namespaced else "Cluster",
            "singularResource": rt.singular,
            "verbs": list(VERBS),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        subresources = list(_subresources(rt))
        if subresources:
            entry["subresources"] = subresources
        listed.append(entry)
    return {"version": version, "resources": listed, "freshness": "Current"}


def _subresources(rt: ResourceType) -> Iterable[Obj]:
    """The subresources the server routes for ``rt``, sorted by name as the real server lists
    them; a ``responseKind`` of another group names it (eviction is ``policy/v1``)."""
    if rt is PODS:
        yield {
            "subresource": "eviction",
            "responseKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "verbs": ["create"],
        }
    if rt.status_subresource:
        yield {
            "subresource": "status",
            "responseKind": {"group": "", "version": "", "kind": rt.kind},
            "verbs": list(_STATUS_VERBS),
        }
