"""Authorization as kube-apiserver's RBAC authorizer decides it, from the RBAC objects stored.

``attributes`` derives a request's attributes as ``k8s.io/apiserver``'s ``RequestInfoFactory``
does: the verb from the method (``get`` without a name is ``list``, or ``watch`` with
``watch=true``; ``delete`` without a name is ``deletecollection``; the legacy ``/watch/`` path
prefix is ``watch``), the API group, the resource and subresource (``pods/eviction``), the
namespace and the name (an exact ``metadata.name=`` field selector names a list or watch).
Paths that are not ``/api/v1/...`` or ``/apis/{group}/{version}/...`` are non-resource requests.

``allows`` then walks what the RBAC authorizer walks: every ClusterRoleBinding whose subjects
take in the user grants its ClusterRole's rules everywhere; in the request's namespace every
RoleBinding that takes in the user grants its Role's, or its ClusterRole's, rules in that
namespace only. A rule matches as ``rbac/v1`` ``RuleAllows`` does: verb, API group and resource
(``*``, ``resource/subresource``, or ``*/subresource``) and, when the rule lists
``resourceNames``, the request's name, which create, and a list or watch without a name, never
have. Non-resource requests are matched on ``nonResourceURLs`` (``*`` or a ``prefix*``), plus
the discovery and health paths the bootstrap policy grants every authenticated user.

``forbidden`` is the 403 the authorization filter answers, with its message word for word.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox.emulator import status
from sandbox.emulator.resources import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    ROLEBINDINGS,
    ROLES,
)

Obj = dict[str, Any]

_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch"}
_VERBS["DELETE"] = "delete"
_SPECIAL_VERBS = ("proxy", "watch")
_NAMESPACE_SUBRESOURCES = ("status", "finalize")
# What the bootstrap ClusterRoles system:discovery and system:public-info-viewer grant every
# authenticated user (the emulator has no bootstrap policy objects, so it grants them itself).
PUBLIC_PATHS = (
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/readyz",
    "/openapi",
    "/openapi/*",
    "/version",
    "/version/",
)


@dataclass(frozen=True, slots=True)
class User:
    """An authenticated identity: ``name`` and ``groups`` as authenticators report them."""

    name: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Attributes:
    """What authorization looks at (``authorizer.Attributes``)."""

    verb: str
    resource_request: bool
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""


def attributes(method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """``RequestInfoFactory.NewRequestInfo`` for one request."""
    parts = [p for p in path.split("/") if p]
    plain = Attributes(verb=method.lower(), resource_request=False, path=path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return plain
    group = ""
    rest = parts[1:]
    if parts[0] == "apis":
        if len(rest) < 3:
            return plain
        group, rest = rest[0], rest[1:]
    version, rest = rest[0], rest[1:]
    by_method = rest[0] not in _SPECIAL_VERBS
    verb = _VERBS.get(method.upper(), "") if by_method else rest[0]
    if not by_method:
        rest = rest[1:]
    namespace = ""
    if rest and rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 and verb != "proxy" else ""
    if not name and verb == "get":
        verb = "watch" if _truthy(query.get("watch")) else "list"
        name = _exact_name(query.get("fieldSelector") or "")
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(
        verb=verb,
        resource_request=True,
        group=group,
        version=version,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
        path=path,
    )


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() not in ("0", "false")


def _exact_name(field_selector: str) -> str:
    """``fieldSelector.RequiresExactMatch("metadata.name")``: one ``=``/``==`` requirement."""
    for term in field_selector.split(","):
        for op in ("==", "="):
            key, found, value = term.partition(op)
            if found and "!" not in key and key.strip() == "metadata.name":
                return value.strip()
    return ""


# ---------------------------------------------------------------------------------------------
# The authorizer


class _Objects:
    """The RBAC objects of a store, read without copying."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def cluster_role(self, name: str) -> Obj | None:
        return next((r for r in self.store.peek(CLUSTERROLES) if _name(r) == name), None)

    def role(self, namespace: str, name: str) -> Obj | None:
        return next(
            (r for r in self.store.peek(ROLES) if _name(r) == name and _ns(r) == namespace), None
        )


def rules_for(store: Any, user: User, namespace: str) -> Iterator[Obj]:
    """Every rule granted to ``user`` in ``namespace`` ('' for cluster-wide only)."""
    objects = _Objects(store)
    for binding in store.peek(CLUSTERROLEBINDINGS):
        if _binds(binding, user, ""):
            role = objects.cluster_role(binding["roleRef"]["name"])
            yield from (role or {}).get("rules") or ()
    if not namespace:
        return
    for binding in store.peek(ROLEBINDINGS):
        if _ns(binding) != namespace or not _binds(binding, user, namespace):
            continue
        ref = binding["roleRef"]
        if ref.get("kind") == "ClusterRole":
            role = objects.cluster_role(ref["name"])
        else:
            role = objects.role(namespace, ref["name"])
        yield from (role or {}).get("rules") or ()


def allows(store: Any, user: User, attrs: Attributes) -> bool:
    """Whether RBAC (plus the bootstrap discovery grant) allows the request."""
    if not attrs.resource_request and any(_url_matches(p, attrs.path) for p in PUBLIC_PATHS):
        return True
    return any(rule_allows(rule, attrs) for rule in rules_for(store, user, attrs.namespace))


def rule_allows(rule: Obj, attrs: Attributes) -> bool:
    """``rbac.RuleAllows``."""
    verbs = rule.get("verbs") or ()
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource_request:
        return any(_url_matches(u, attrs.path) for u in rule.get("nonResourceURLs") or ())
    groups = rule.get("apiGroups") or ()
    if "*" not in groups and attrs.group not in groups:
        return False
    wanted = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
    resources = rule.get("resources") or ()
    if not any(
        r in ("*", wanted) or (attrs.subresource and r == f"*/{attrs.subresource}")
        for r in resources
    ):
        return False
    names = rule.get("resourceNames") or ()
    return not names or attrs.name in names


def _url_matches(pattern: str, path: str) -> bool:
    if pattern in ("*", path):
        return True
    return pattern.endswith("*") and path.startswith(pattern[:-1])


def _binds(binding: Obj, user: User, namespace: str) -> bool:
    """``appliesTo``: a subject names the user, one of its groups, or its service account (a
    RoleBinding's service account subject without a namespace means the binding's)."""
    for subject in binding.get("subjects") or ():
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "User" and name == user.name:
            return True
        if kind == "Group" and name in user.groups:
            return True
        if kind == "ServiceAccount":
            sa_namespace = subject.get("namespace") or namespace
            if sa_namespace and user.name == service_account_name(sa_namespace, str(name)):
                return True
    return False


def service_account_name(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def forbidden(user: User, attrs: Attributes) -> status.ApiError:
    """The authorization filter's 403 (``responsewriters.Forbidden``)."""
    if not attrs.resource_request:
        why = f'User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
        return status.denied("", "", "", why)
    resource = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
    why = (
        f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}"'
    )
    if attrs.namespace:
        why += f' in the namespace "{attrs.namespace}"'
    else:
        why += " at the cluster scope"
    return status.denied(attrs.resource, attrs.group, attrs.name, why)


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _ns(obj: Obj) -> str:
    return str(obj["metadata"].get("namespace", ""))
