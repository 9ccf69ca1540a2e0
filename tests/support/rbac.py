"""The Helm chart's RBAC in a test's cluster, and what it granted against what was used.

``apply_to`` puts the rendered ServiceAccount, ClusterRole(s), Role(s) and bindings into a
cluster (``backends.Objects``: the emulator's store, or a real kube-apiserver as its admin, where
it waits until the authorizer allows every rendered grant), so the controller can run as the
chart's service account under exactly the rendered rules (``chart_access`` gives the emulator
both tokens). ``grants`` reads what
the rules grant, and ``unused``/``used`` compare it with the decisions the emulator's authorizer
recorded (``Access.decisions``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sandbox.emulator.auth import Access, Decision, admin, service_account
from sandbox.emulator.rbac import User
from sandbox.emulator.resources import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    ROLEBINDINGS,
    ROLES,
    SERVICEACCOUNTS,
)
from tests.support import kube
from tests.support.backends import Objects, RealCluster

ADMIN_TOKEN = kube.ADMIN_TOKEN  # a system:masters user: the test itself, applying manifests
CONTROLLER_TOKEN = kube.CONTROLLER_TOKEN  # the chart's service account: the controller
Doc = dict[str, Any]


def service_account_of(docs: Iterable[Doc]) -> User:
    """The user the chart's ServiceAccount authenticates as."""
    (account,) = [d for d in rbac_of(docs) if d.get("kind") == "ServiceAccount"]
    meta = account["metadata"]
    return service_account(meta["namespace"], meta["name"])


def chart_access(docs: Iterable[Doc]) -> Access:
    """Tokens for an admin and for the chart's service account."""
    return Access({ADMIN_TOKEN: admin(), CONTROLLER_TOKEN: service_account_of(docs)})


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


_TYPES = {
    "ServiceAccount": SERVICEACCOUNTS,
    "ClusterRole": CLUSTERROLES,
    "ClusterRoleBinding": CLUSTERROLEBINDINGS,
    "Role": ROLES,
    "RoleBinding": ROLEBINDINGS,
}


def apply_to(
    objects: Objects, docs: Iterable[Doc], within: float = 10.0, user: User | None = None
) -> list[Doc]:
    """Create the chart's ServiceAccount and RBAC objects in ``objects``, as the admin; on a
    real kube-apiserver, wait until its authorizer allows every grant they render to ``user``
    (the ServiceAccount among ``docs`` unless given: a hook's roles bind the install's)."""
    applied = [d for d in docs if d.get("kind") in _TYPES]
    for doc in applied:
        objects.create(_TYPES[doc["kind"]], doc["metadata"].get("namespace"), doc)
    if isinstance(objects, RealCluster):
        user = user or service_account_of(applied)
        waiting = {(g, name) for g in grants(applied) for name in g.names or ("",)}
        deadline = time.monotonic() + within
        while waiting:
            waiting = {
                (g, name)
                for g, name in waiting
                if not objects.allowed(user, g.verb, g.group, g.resource, g.namespace, name)
            }
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(f"kube-apiserver does not allow {sorted(waiting)}")
            if waiting:
                time.sleep(0.05)
    return applied


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource (``pods/eviction`` for a subresource) of one API group, granted
    cluster-wide (``namespace`` empty: a ClusterRole) or in one namespace (a Role), limited to
    ``names`` when the rule lists resourceNames."""

    verb: str
    group: str
    resource: str
    namespace: str = ""
    names: tuple[str, ...] = ()

    def covers(self, d: Decision) -> bool:
        resource = d.resource + (f"/{d.subresource}" if d.subresource else "")
        return (
            (self.verb, self.group, self.resource) == (d.verb, d.group, resource)
            and (not self.namespace or self.namespace == d.namespace)
            and (not self.names or d.name in self.names)
        )


def rbac_of(docs: Iterable[Doc]) -> list[Doc]:
    """The chart's ServiceAccount, roles and bindings among rendered ``docs``: the controller's,
    not those that grant others the use of its HTTP API (``api_access_of``)."""
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    return [d for d in docs if d["kind"] in kinds and not _for_others(d)]


def api_access_of(docs: Iterable[Doc]) -> list[Doc]:
    """What the chart renders to let others use the HTTP API (templates/api-access.yaml)."""
    return [d for d in docs if _for_others(d)]


def _for_others(doc: Doc) -> bool:
    labels = doc.get("metadata", {}).get("labels") or {}
    return bool(labels.get("app.kubernetes.io/component") == "api-access")


def grants(docs: Iterable[Doc]) -> set[Grant]:
    """Every grant on resources of the controller's rendered ClusterRoles (cluster-wide) and
    Roles (in their namespace); not those for others (``api_access_of``)."""
    out: set[Grant] = set()
    for doc in docs:
        if doc.get("kind") not in ("ClusterRole", "Role") or _for_others(doc):
            continue
        namespace = doc["metadata"].get("namespace", "") if doc["kind"] == "Role" else ""
        for rule in doc.get("rules") or ():
            if "resources" not in rule:  # nonResourceURLs: the HTTP API's (test_api_access.py)
                continue
            names = tuple(rule.get("resourceNames") or ())
            for verb in rule["verbs"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        out.add(Grant(verb, group, resource, namespace, names))
    return out


def unused(granted: Iterable[Grant], decisions: Iterable[Decision]) -> set[Grant]:
    """The grants no allowed request among ``decisions`` needed."""
    allowed = [d for d in decisions if d.allowed]
    return {g for g in granted if not any(g.covers(d) for d in allowed)}


def used(decisions: Iterable[Decision]) -> set[tuple[str, str, str, str]]:
    """(verb, group, resource[/subresource], namespace or '*') of every allowed request."""
    return {
        (
            d.verb,
            d.group,
            d.resource + (f"/{d.subresource}" if d.subresource else ""),
            d.namespace or "*",
        )
        for d in decisions
        if d.allowed
    }


# What the chart's roles grant that an end-to-end run may not use (a pod is read only through lists
# and watches, Events are only ever created): pods are deleted only when an eviction has not
# emptied a node by the reclaim deadline, which a slow run may reach, each marked
# DisruptionTarget through its status first (``tests/chart/test_rbac.py`` proves both grants
# needed); a pod is patched only by a reclaim notice (its annotations; its condition through
# its status), which a run whose reclaims are all urgent never gives (proven needed there too);
# a node is read by a GET only when the informer's cache does not hold it or a
# reclaim's cached read met a 409 (``adapters/actuator.py``), and ``rebalancer reclaim``, which
# runs no informer, reads every node so (``tests/test_cli_run.py``).
MAY_GO_UNUSED = {
    Grant("delete", "", "pods"),
    Grant("patch", "", "pods"),
    Grant("patch", "", "pods/status"),
    Grant("get", "", "nodes"),
    # The nodes listed page by page: only from a server that does not stream a list in a watch
    # (``adapters.reflector``); kube-apiserver 1.36 streams it, and authorizes the watch alone.
    Grant("list", "", "nodes"),
    # A notice's EvictionRequests: only where the cluster serves them (1.37 and later, the
    # API's gate on), which neither the emulator nor the suite's 1.36 server does.
    Grant("get", "lifecycle.k8s.io", "evictionrequests"),
    Grant("create", "lifecycle.k8s.io", "evictionrequests"),
    Grant("patch", "lifecycle.k8s.io", "evictionrequests"),
    Grant("list", "lifecycle.k8s.io", "evictions"),
    # The replica's own Events (its Pod's namespace: the release's): only when its settings
    # file changes, which no end-to-end run does (``tests/test_settings_live.py`` proves it).
    Grant("create", "events.k8s.io", "events", "rebalancer"),
}
