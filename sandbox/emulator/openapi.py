"""OpenAPI v3: the emulator's API described as kube-apiserver describes its own.

``kubectl explain node`` reads the schema of a kind from ``/openapi/v3/api/v1``, and ``kubectl
create``/``replace`` (validation on, the default) read the PATCH operation of the kind there to
learn whether the server takes the ``fieldValidation`` parameter. ``/openapi/v3`` lists one
document per group version, each named by the hash of its content so clients can cache it.

Everything is generated from ``resources.ALL``: one path per endpoint the server routes
(collections, objects, ``status``, ``pods/eviction``), each operation with its
``x-kubernetes-action`` and ``x-kubernetes-group-version-kind`` and the query parameters the
emulator reads, and one schema per kind. The schemas are deliberately shallow: a kind lists its
top-level fields (``spec``, ``status``, an Event's ``involvedObject``...) with a type and one
line, and ``metadata`` has ``ObjectMeta``'s fields; every nested object is open
(``x-kubernetes-preserve-unknown-fields``), which is what the emulator does with it: it stores and
echoes fields it does not know. The operations list ``fieldValidation`` because the server
accepts it (and, like every unknown field, ignores it: README, known differences), so kubectl
leaves validation to the server instead of downloading the protobuf ``/openapi/v2``, which the
emulator does not serve.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sandbox.emulator import discovery, resources
from sandbox.emulator.resources import PODS, ResourceType

Obj = dict[str, Any]

_META = "io.k8s.apimachinery.pkg.apis.meta.v1"
_OPEN: Obj = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _field(kind: str, description: str) -> Obj:
    """A top-level field: ``object`` (open), ``string``, ``integer``, ``boolean``, ``time``,
    ``microtime`` or ``array`` (of open objects)."""
    if kind == "object":
        return {"description": description, **_OPEN}
    if kind == "array":
        return {"description": description, "type": "array", "items": dict(_OPEN)}
    if kind in ("time", "microtime"):
        return {"description": description, "type": "string", "format": "date-time"}
    return {"description": description, "type": kind}


_SPEC_STATUS = {
    "spec": ("object", "The desired state of the object."),
    "status": ("object", "The most recently observed state of the object. Read-only."),
}
_CORE_EVENT = {
    "involvedObject": ("object", "The object that this event is about."),
    "reason": ("string", "Why the object moved into its current state, in one word."),
    "message": ("string", "A human-readable description of the status of this operation."),
    "type": ("string", "Type of this event (Normal, Warning)."),
    "source": ("object", "The component reporting this event."),
    "firstTimestamp": ("time", "The time at which the event was first recorded."),
    "lastTimestamp": ("time", "The time at which the most recent occurrence was recorded."),
    "count": ("integer", "The number of times this event has occurred."),
    "eventTime": ("microtime", "Time when this Event was first observed."),
    "series": ("object", "Data about the Event series this event represents."),
    "action": ("string", "What action was taken or failed regarding the object."),
    "related": ("object", "Optional secondary object for more complex actions."),
    "reportingComponent": ("string", "Name of the controller that emitted this Event."),
    "reportingInstance": ("string", "ID of the controller instance."),
}
_V1_EVENT = {
    "regarding": ("object", "The object this Event is about."),
    "reason": ("string", "Why the action was taken, in one word."),
    "note": ("string", "A human-readable description of the status of this operation."),
    "type": ("string", "Type of this event (Normal, Warning)."),
    "eventTime": ("microtime", "Time when this Event was first observed."),
    "series": ("object", "Data about the Event series this event represents."),
    "action": ("string", "What action was taken or failed regarding the regarding object."),
    "related": ("object", "Optional secondary object for more complex actions."),
    "reportingController": ("string", "Name of the controller that emitted this Event."),
    "reportingInstance": ("string", "ID of the controller instance."),
    "deprecatedSource": ("object", "The source of the event, in the core/v1 form."),
    "deprecatedFirstTimestamp": ("time", "firstTimestamp, in the core/v1 form."),
    "deprecatedLastTimestamp": ("time", "lastTimestamp, in the core/v1 form."),
    "deprecatedCount": ("integer", "count, in the core/v1 form."),
}
_RULES = {"rules": ("array", "The PolicyRules of this role.")}
_BINDING = {
    "subjects": ("array", "The users, groups and service accounts the role is bound to."),
    "roleRef": ("object", "The Role or ClusterRole bound."),
}
# Each kind's top-level fields besides apiVersion, kind and metadata, and its description.
_KINDS: dict[tuple[str, str], tuple[str, dict[str, tuple[str, str]]]] = {
    ("", "Node"): ("Node is a worker node in Kubernetes.", _SPEC_STATUS),
    ("", "Pod"): ("Pod is a collection of containers that can run on a host.", _SPEC_STATUS),
    ("", "Event"): ("Event is a report of an event somewhere in the cluster.", _CORE_EVENT),
    ("", "ServiceAccount"): (
        "ServiceAccount binds together a name, a principal and a set of secrets.",
        {
            "secrets": ("array", "Secrets in the same namespace pods may use."),
            "imagePullSecrets": ("array", "Secrets used to pull images for pods."),
            "automountServiceAccountToken": ("boolean", "Whether pods mount a token."),
        },
    ),
    ("policy", "PodDisruptionBudget"): (
        "PodDisruptionBudget limits the number of pods disrupted at once.",
        _SPEC_STATUS,
    ),
    ("coordination.k8s.io", "Lease"): (
        "Lease defines a lease concept.",
        {"spec": ("object", "The specification of the Lease.")},
    ),
    ("events.k8s.io", "Event"): ("Event is a report of an event in the cluster.", _V1_EVENT),
    (resources.RBAC_GROUP, "ClusterRole"): (
        "A cluster-wide set of PolicyRules, bound as a unit.",
        {**_RULES, "aggregationRule": ("object", "How the rules are aggregated.")},
    ),
    (resources.RBAC_GROUP, "Role"): ("A namespaced set of PolicyRules.", _RULES),
    (resources.RBAC_GROUP, "ClusterRoleBinding"): (
        "Binds a ClusterRole to subjects, cluster-wide.",
        _BINDING,
    ),
    (resources.RBAC_GROUP, "RoleBinding"): ("Binds a role to subjects, in a namespace.", _BINDING),
}
_EVICTION: Obj = {
    "description": "Eviction evicts a pod from its node subject to certain policies.",
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"allOf": [{"$ref": f"#/components/schemas/{_META}.ObjectMeta"}]},
        "deleteOptions": _field("object", "DeleteOptions may be provided."),
    },
    "x-kubernetes-group-version-kind": [{"group": "policy", "kind": "Eviction", "version": "v1"}],
}


def paths() -> list[str]:
    """The document paths ``/openapi/v3`` lists: ``api/v1``, ``apis/policy/v1``..."""
    named = [f"apis/{g}/{v}" for g in discovery.groups() for v in discovery.versions(g)]
    return ["api/v1", *named]


def index() -> Obj:
    """``GET /openapi/v3``: each document's URL, with the hash of its content."""
    found = {}
    for path in paths():
        group, version = _split(path)
        digest = hashlib.sha512(_encoded(document(group, version))).hexdigest().upper()
        found[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": found}


def _split(path: str) -> tuple[str, str]:
    parts = path.split("/")
    return ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])


def _encoded(doc: Obj) -> bytes:
    return json.dumps(doc, sort_keys=True).encode()


def find(path: str) -> Obj | None:
    """The document at ``/openapi/v3/{path}``, or ``None``."""
    if path not in paths():
        return None
    return document(*_split(path))


def document(group: str, version: str) -> Obj:
    served = [rt for rt in resources.ALL if rt.group == group and rt.version == version]
    schemas: Obj = {f"{_META}.ObjectMeta": _object_meta(), f"{_META}.ListMeta": _list_meta()}
    doc_paths: Obj = {}
    for rt in served:
        name = _schema_name(rt.group, rt.kind)
        schemas[name] = _kind_schema(rt)
        schemas[_schema_name(rt.group, rt.list_kind)] = _list_schema(rt, name)
        doc_paths.update(_paths_of(rt))
        if rt is PODS:
            schemas[_schema_name("policy", "Eviction")] = _EVICTION
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "1.34"},  # the release /version names
        "paths": doc_paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "BearerToken": {
                    "type": "apiKey",
                    "description": "Bearer Token authentication",
                    "name": "authorization",
                    "in": "header",
                }
            },
        },
    }


def _schema_name(group: str, kind: str) -> str:
    """The Go package's name for a kind, as the real documents name their schemas:
    ``io.k8s.api.core.v1.Node``, ``io.k8s.api.policy.v1.PodDisruptionBudget``."""
    package = {"": "core", resources.RBAC_GROUP: "rbac"}.get(group, group.partition(".")[0])
    return f"io.k8s.api.{package}.v1.{kind}"


def _gvk(rt: ResourceType) -> Obj:
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def _ref(name: str) -> Obj:
    return {"$ref": f"#/components/schemas/{name}"}


def _kind_schema(rt: ResourceType) -> Obj:
    description, fields = _KINDS[(rt.group, rt.kind)]
    properties: Obj = {
        "apiVersion": _field("string", "APIVersion defines the versioned schema of the object."),
        "kind": _field("string", "Kind is the REST resource this object represents."),
        "metadata": {
            "description": "Standard object's metadata.",
            "default": {},
            "allOf": [_ref(f"{_META}.ObjectMeta")],
        },
    }
    for name, (kind, text) in fields.items():
        properties[name] = _field(kind, text)
    schema: Obj = {
        "description": description,
        "type": "object",
        "properties": properties,
        "x-kubernetes-group-version-kind": [_gvk(rt)],
    }
    if rt.group == "" and rt.kind == "Event":
        schema["required"] = ["metadata", "involvedObject"]
    if rt.group == "events.k8s.io":
        schema["required"] = ["eventTime"]
    return schema


def _list_schema(rt: ResourceType, item: str) -> Obj:
    return {
        "description": f"A list of {rt.kind} objects.",
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": _field("string", "APIVersion of the list."),
            "kind": _field("string", "Kind of the list."),
            "metadata": {"default": {}, "allOf": [_ref(f"{_META}.ListMeta")]},
            "items": {"type": "array", "items": {"default": {}, "allOf": [_ref(item)]}},
        },
        "x-kubernetes-group-version-kind": [
            {"group": rt.group, "version": rt.version, "kind": rt.list_kind}
        ],
    }


def _object_meta() -> Obj:
    strings = {"type": "object", "additionalProperties": {"type": "string", "default": ""}}
    fields: Obj = {
        "name": _field("string", "Name must be unique within a namespace."),
        "generateName": _field("string", "A prefix the server makes a unique name from."),
        "namespace": _field("string", "The namespace of the object; empty for cluster-wide."),
        "uid": _field("string", "The unique in time and space value for this object."),
        "resourceVersion": _field("string", "The version of the object, for concurrency."),
        "generation": _field("integer", "A sequence number of the desired state."),
        "creationTimestamp": _field("time", "The server time when the object was created."),
        "deletionTimestamp": _field("time", "When the object will be deleted. Read-only."),
        "deletionGracePeriodSeconds": _field("integer", "Seconds allowed to terminate."),
        "labels": {"description": "Labels, for selecting objects.", **strings},
        "annotations": {"description": "Annotations: arbitrary metadata.", **strings},
        "ownerReferences": _field("array", "The objects this object depends on."),
        "finalizers": {
            "description": "Must be empty before the object is deleted from the registry.",
            "type": "array",
            "items": {"type": "string", "default": ""},
            "x-kubernetes-list-type": "set",
        },
    }
    return {
        "description": "ObjectMeta is metadata that all persisted resources must have.",
        "type": "object",
        "properties": fields,
    }


def _list_meta() -> Obj:
    return {
        "description": "ListMeta describes metadata that synthetic resources must have.",
        "type": "object",
        "properties": {
            "resourceVersion": _field("string", "The version of the list."),
            "continue": _field("string", "Set if more items are available."),
            "remainingItemCount": _field("integer", "Items left after this page."),
        },
    }


# ---------------------------------------------------------------------------------------------
# Paths


def _query(name: str, kind: str = "string") -> Obj:
    return {"name": name, "in": "query", "schema": {"type": kind, "uniqueItems": True}}


_LIST_QUERY = [
    _query("allowWatchBookmarks", "boolean"),
    _query("continue"),
    _query("fieldSelector"),
    _query("labelSelector"),
    _query("limit", "integer"),
    _query("resourceVersion"),
    _query("sendInitialEvents", "boolean"),
    _query("timeoutSeconds", "integer"),
    _query("watch", "boolean"),
]
_WRITE_QUERY = [_query("dryRun"), _query("fieldManager"), _query("fieldValidation")]
_DELETE_QUERY = [_query("dryRun"), _query("gracePeriodSeconds", "integer")]
_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)


def _path_param(name: str, what: str) -> Obj:
    return {
        "name": name,
        "in": "path",
        "description": f"{name} of the {what}",
        "required": True,
        "schema": {"type": "string", "uniqueItems": True},
    }


def _operation(
    rt: ResourceType, action: str, reply: str, params: list[Obj], body: Obj | None = None
) -> Obj:
    op: Obj = {
        "description": f"{action} {rt.kind}",
        "parameters": params,
        "responses": {
            "200": {
                "description": "OK",
                "content": {"application/json": {"schema": _ref(reply)}},
            }
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rt),
    }
    if body is not None:
        op["requestBody"] = {"content": body, "required": True}
    return op


def _paths_of(rt: ResourceType) -> Obj:
    prefix = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
    scope = f"{prefix}/namespaces/{{namespace}}" if rt.namespaced else prefix
    kind, listed = _schema_name(rt.group, rt.kind), _schema_name(rt.group, rt.list_kind)
    whole = {"*/*": {"schema": _ref(kind)}}
    patch = {t: {"schema": {"type": "object"}} for t in _PATCH_TYPES}
    scoped = [_path_param("namespace", "namespace")] if rt.namespaced else []
    named = [_path_param("name", rt.kind), *scoped]
    out: Obj = {
        f"{scope}/{rt.plural}": {
            "get": _operation(rt, "list", listed, _LIST_QUERY),
            "post": _operation(rt, "post", kind, _WRITE_QUERY, whole),
            "parameters": scoped,
        },
        f"{scope}/{rt.plural}/{{name}}": {
            "get": _operation(rt, "get", kind, []),
            "put": _operation(rt, "put", kind, _WRITE_QUERY, whole),
            "patch": _operation(rt, "patch", kind, _WRITE_QUERY, patch),
            "delete": _operation(rt, "delete", kind, _DELETE_QUERY),
            "parameters": named,
        },
    }
    if rt.namespaced:
        out[f"{prefix}/{rt.plural}"] = {"get": _operation(rt, "list", listed, _LIST_QUERY)}
    if rt.status_subresource:
        out[f"{scope}/{rt.plural}/{{name}}/status"] = {
            "get": _operation(rt, "get", kind, []),
            "put": _operation(rt, "put", kind, _WRITE_QUERY, whole),
            "patch": _operation(rt, "patch", kind, _WRITE_QUERY, patch),
            "parameters": named,
        }
    if rt is PODS:
        eviction = _schema_name("policy", "Eviction")
        evict = _operation(
            rt, "post", eviction, [_query("dryRun")], {"*/*": {"schema": _ref(eviction)}}
        )
        evict["x-kubernetes-group-version-kind"] = {
            "group": "policy",
            "version": "v1",
            "kind": "Eviction",
        }
        out[f"{scope}/{rt.plural}/{{name}}/eviction"] = {"post": evict, "parameters": named}
    return out
