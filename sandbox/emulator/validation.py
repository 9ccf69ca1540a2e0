"""Field validation the real server applies to the objects a controller writes.

Each check returns ``status.Cause`` values shaped like ``field.Error``: the path
(``spec.taints[1]``) in ``field`` and the body (``Duplicate value: ...: taints must be unique
by key and effect pair``) in ``message``, so a 422 from the emulator reads like one from
kube-apiserver. Only the rules a
node, pod, budget, lease or event writer can trip are here (names, labels, annotations, taints,
tolerations, the immutable parts of a pod and of metadata, budgets, events).
"""

from __future__ import annotations

import json
import re
from typing import Any

from sandbox.emulator import quantity
from sandbox.emulator.selector import valid_label_value, valid_qualified_name
from sandbox.emulator.status import Cause

Obj = dict[str, Any]

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_KEY_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',"
    "  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
EFFECTS = ("NoExecute", "NoSchedule", "PreferNoSchedule")
_ANNOTATIONS_LIMIT = 256 * 1024
POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
    "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set "
    "to 1 if it was previously negative)"
)


def go_value(value: Any) -> str:
    """How ``field.Error`` prints a bad value: strings quoted, numbers bare."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value) if isinstance(value, str) else json.dumps(value, sort_keys=True)


def required(path: str, detail: str = "") -> Cause:
    return Cause("FieldValueRequired", "Required value" + (f": {detail}" if detail else ""), path)


def invalid(path: str, value: Any, detail: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {go_value(value)}: {detail}", path)


def forbidden(path: str, detail: str) -> Cause:
    return Cause("FieldValueForbidden", f"Forbidden: {detail}", path)


def unsupported(path: str, value: Any, supported: tuple[str, ...]) -> Cause:
    listed = ", ".join(json.dumps(s) for s in supported)
    message = f"Unsupported value: {go_value(value)}: supported values: {listed}"
    return Cause("FieldValueNotSupported", message, path)


# ---------------------------------------------------------------------------------------------
# Metadata


def name(meta: Obj, generate_ok: bool = True) -> list[Cause]:
    value, prefix = meta.get("name"), str(meta.get("generateName") or "")
    causes = []
    # A prefix must be a name itself once a trailing dash is masked (as kube-apiserver's
    # ValidateObjectMeta does): "node-" is a prefix, "node." is not.
    masked = prefix[:-1] + "a" if prefix and prefix.endswith("-") else prefix
    if generate_ok and prefix and (len(prefix) > 253 or not _SUBDOMAIN.fullmatch(masked)):
        causes.append(invalid("metadata.generateName", prefix, _SUBDOMAIN_MESSAGE))
    if not value:
        if generate_ok and prefix:
            return causes
        return [required("metadata.name", "name or generateName is required")]
    if len(value) > 253 or not _SUBDOMAIN.fullmatch(value):
        causes.append(invalid("metadata.name", value, _SUBDOMAIN_MESSAGE))
    return causes


def labels(meta: Obj) -> list[Cause]:
    causes = []
    for key, value in (meta.get("labels") or {}).items():
        if not valid_qualified_name(key):
            causes.append(invalid("metadata.labels", key, _KEY_MESSAGE))
        if not valid_label_value(str(value)):
            causes.append(invalid("metadata.labels", value, _VALUE_MESSAGE))
    return causes


def annotation_keys(meta: Obj) -> list[Cause]:
    values = meta.get("annotations") or {}
    causes = [
        invalid("metadata.annotations", key, _KEY_MESSAGE)
        for key in values
        if not valid_qualified_name(key.lower())
    ]
    size = sum(len(k) + len(str(v)) for k, v in values.items())
    if size > _ANNOTATIONS_LIMIT:
        causes.append(
            Cause(
                "FieldValueTooLong",
                f"Too long: must have at most {_ANNOTATIONS_LIMIT} bytes",
                "metadata.annotations",
            )
        )
    return causes


def metadata_update(new: Obj, old: Obj) -> list[Cause]:
    causes = []
    for key in ("name", "namespace", "uid"):
        if new.get(key, "") != old.get(key, ""):
            causes.append(invalid(f"metadata.{key}", new.get(key, ""), "field is immutable"))
    if old.get("deletionTimestamp"):
        added = [f for f in new.get("finalizers") or [] if f not in (old.get("finalizers") or [])]
        if added:
            found = "[]string{" + ", ".join(json.dumps(f) for f in added) + "}"
            causes.append(
                forbidden(
                    "metadata.finalizers",
                    f"no new finalizers can be added if the object is being deleted, found new "
                    f"finalizers {found}",
                )
            )
    return causes


# ---------------------------------------------------------------------------------------------
# Nodes and pods


def taints(taint_list: Any, path: str = "spec.taints") -> list[Cause]:
    causes: list[Cause] = []
    seen: set[tuple[str, str]] = set()
    for index, taint in enumerate(taint_list or []):
        at = f"{path}[{index}]"
        key, value, effect = taint.get("key", ""), taint.get("value", ""), taint.get("effect", "")
        if not key:
            causes.append(required(f"{at}.key"))
        elif not valid_qualified_name(key):
            causes.append(invalid(f"{at}.key", key, _KEY_MESSAGE))
        if not valid_label_value(value):
            causes.append(invalid(f"{at}.value", value, _VALUE_MESSAGE))
        if not effect:
            causes.append(required(f"{at}.effect"))
        elif effect not in EFFECTS:
            causes.append(unsupported(f"{at}.effect", effect, EFFECTS))
        if (key, effect) in seen:
            shown = (
                f'core.Taint{{Key:"{key}", Value:"{value}", Effect:"{effect}", TimeAdded:<nil>}}'
            )
            message = f"Duplicate value: {shown}: taints must be unique by key and effect pair"
            causes.append(Cause("FieldValueDuplicate", message, at))
        seen.add((key, effect))
    return causes


def tolerations(items: Any, path: str = "spec.tolerations") -> list[Cause]:
    causes = []
    for index, toleration in enumerate(items or []):
        at = f"{path}[{index}]"
        operator = toleration.get("operator") or "Equal"
        if not toleration.get("key") and operator != "Exists":
            causes.append(
                invalid(
                    f"{at}.operator",
                    operator,
                    'operator must be Exists when `key` is empty, which means "match all '
                    'values and all keys"',
                )
            )
        if operator == "Exists" and toleration.get("value"):
            causes.append(
                invalid(
                    f"{at}.operator",
                    toleration["value"],
                    "value must be empty when `operator` is 'Exists'",
                )
            )
        if operator not in ("Equal", "Exists"):
            causes.append(unsupported(f"{at}.operator", operator, ("Equal", "Exists")))
        effect = toleration.get("effect")
        if effect and effect not in EFFECTS:
            causes.append(unsupported(f"{at}.effect", effect, EFFECTS))
    return causes


def pod_spec(spec: Obj) -> list[Cause]:
    containers = spec.get("containers") or []
    causes = [] if containers else [required("spec.containers")]
    for index, container in enumerate(containers):
        if not container.get("name"):
            causes.append(required(f"spec.containers[{index}].name"))
        if not container.get("image"):
            causes.append(required(f"spec.containers[{index}].image"))
        causes += _resources(container.get("resources") or {}, f"spec.containers[{index}]")
    return causes + tolerations(spec.get("tolerations"))


def _resources(resources: Obj, at: str) -> list[Cause]:
    causes = []
    for part in ("requests", "limits"):
        for name_, value in (resources.get(part) or {}).items():
            try:
                quantity.parse(value)
            except ValueError as exc:
                causes.append(invalid(f"{at}.resources.{part}[{name_}]", value, str(exc)))
    return causes


def pod_conditions(pod_status: Any) -> list[Cause]:
    """A pod's condition types are qualified names (``rebalancer.io/ReclaimNotice``, or one of
    Kubernetes' own, which all are): kube-apiserver refuses any other on a status update."""
    causes = []
    for index, condition in enumerate((pod_status or {}).get("conditions") or ()):
        kind = str((condition or {}).get("type") or "")
        if not valid_qualified_name(kind):
            causes.append(invalid(f"status.conditions[{index}].Type", kind, _KEY_MESSAGE))
    return causes


def pod_spec_update(new: Obj, old: Obj) -> list[Cause]:
    """Pods are immutable but for images, deadlines and added tolerations."""
    if _mutable_masked(new, old) == _mutable_masked(old, old):
        return []
    return [forbidden("spec", POD_UPDATE_FORBIDDEN)]


def _mutable_masked(spec: Obj, old: Obj) -> Obj:
    masked = json.loads(json.dumps(spec))
    for group in ("containers", "initContainers"):
        for container in masked.get(group) or []:
            container.pop("image", None)
    masked.pop("activeDeadlineSeconds", None)
    old_tolerations = old.get("tolerations") or []
    tolerations_ = masked.get("tolerations") or []
    if tolerations_[: len(old_tolerations)] == old_tolerations:
        masked["tolerations"] = old_tolerations
    masked.pop("schedulingGates", None)
    return dict(masked)


# ---------------------------------------------------------------------------------------------
# Budgets and events


def budget(spec: Obj) -> list[Cause]:
    causes = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        causes.append(invalid("spec", spec, "minAvailable and maxUnavailable cannot be both set"))
    for key in ("minAvailable", "maxUnavailable"):
        value = spec.get(key)
        if isinstance(value, int) and value < 0:
            causes.append(invalid(f"spec.{key}", value, "must be greater than or equal to 0"))
        if isinstance(value, str) and not re.fullmatch(r"[0-9]+%", value):
            causes.append(
                invalid(
                    f"spec.{key}",
                    value,
                    "a valid percent string must be a numeric string followed by an ending "
                    "'%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                )
            )
    return causes


def event(obj: Obj, strict: bool) -> list[Cause]:
    """``ValidateEventCreate``: legacy rules always, the strict ones for events.k8s.io/v1."""
    causes = _legacy_event(obj)
    if not strict:
        return causes
    causes += name(obj.get("metadata") or {})
    if not obj.get("eventTime"):
        causes.append(required("eventTime"))
    if obj.get("type") not in ("Normal", "Warning"):
        causes.append(invalid("type", "", f"has invalid value: {obj.get('type') or ''}"))
    for key in ("firstTimestamp", "lastTimestamp"):
        if obj.get(key):
            causes.append(invalid(key, "", "needs to be unset"))
    if obj.get("count"):
        causes.append(invalid("count", "", "needs to be unset"))
    source = obj.get("source") or {}
    if source.get("component") or source.get("host"):
        causes.append(invalid("source", "", "needs to be unset"))
    return causes


def _legacy_event(obj: Obj) -> list[Cause]:
    namespace = (obj.get("metadata") or {}).get("namespace", "")
    involved = (obj.get("involvedObject") or {}).get("namespace", "")
    causes = []
    if not obj.get("eventTime"):
        if (involved and involved != namespace) or (
            not involved and namespace not in ("", "default")
        ):
            causes.append(
                invalid("involvedObject.namespace", involved, "does not match event.namespace")
            )
        return causes
    if not involved and namespace not in ("default", "kube-system"):
        causes.append(
            invalid("involvedObject.namespace", involved, "does not match event.namespace")
        )
    controller = obj.get("reportingComponent") or ""
    if not controller:
        causes.append(required("reportingController"))
    elif not valid_qualified_name(controller):
        causes.append(invalid("reportingController", controller, _KEY_MESSAGE))
    for key, limit in (("reportingInstance", 128), ("action", 128), ("reason", 128)):
        if not obj.get(key):
            causes.append(required(key))
        elif len(obj[key]) > limit:
            causes.append(invalid(key, "", f"can have at most {limit} characters"))
    if len(obj.get("message") or "") > 1024:
        causes.append(invalid("message", "", "can have at most 1024 characters"))
    return causes


# ---------------------------------------------------------------------------------------------
# RBAC (k8s.io/kubernetes/pkg/apis/rbac/validation)


def path_segment_name(meta: Obj) -> list[Cause]:
    """RBAC names are path segments (``system:controller:x`` is valid), not subdomains."""
    value = meta.get("name")
    if not value:
        return [required("metadata.name", "name or generateName is required")]
    for bad in (".", ".."):
        if value == bad:
            return [invalid("metadata.name", value, f"may not be '{bad}'")]
    for bad in ("/", "%"):
        if bad in value:
            return [invalid("metadata.name", value, f"may not contain '{bad}'")]
    return []


def policy_rules(rules: Any, namespaced: bool) -> list[Cause]:
    causes: list[Cause] = []
    for i, rule in enumerate(rules or []):
        at = f"rules[{i}]"
        if not isinstance(rule, dict):
            causes.append(invalid(at, rule, "must be an object"))
            continue
        if not rule.get("verbs"):
            causes.append(required(f"{at}.verbs", "verbs must contain at least one value"))
        urls = rule.get("nonResourceURLs")
        if urls:
            if namespaced:
                causes.append(
                    invalid(
                        f"{at}.nonResourceURLs",
                        urls,
                        "namespaced rules cannot apply to non-resource URLs",
                    )
                )
            if rule.get("apiGroups") or rule.get("resources") or rule.get("resourceNames"):
                causes.append(
                    invalid(
                        f"{at}.nonResourceURLs",
                        urls,
                        "rules cannot apply to both regular resources and non-resource URLs",
                    )
                )
            continue
        if not rule.get("apiGroups"):
            causes.append(
                required(f"{at}.apiGroups", "resource rules must supply at least one api group")
            )
        if not rule.get("resources"):
            causes.append(
                required(f"{at}.resources", "resource rules must supply at least one resource")
            )
    return causes


_SUBJECT_KINDS = ("ServiceAccount", "User", "Group")


def binding(obj: Obj, cluster: bool) -> list[Cause]:
    causes: list[Cause] = []
    ref = obj.get("roleRef") or {}
    kinds = ("ClusterRole",) if cluster else ("Role", "ClusterRole")
    if ref.get("apiGroup", "") != "rbac.authorization.k8s.io":
        causes.append(
            unsupported("roleRef.apiGroup", ref.get("apiGroup", ""), ("rbac.authorization.k8s.io",))
        )
    if ref.get("kind") not in kinds:
        causes.append(unsupported("roleRef.kind", ref.get("kind", ""), kinds))
    if not ref.get("name"):
        causes.append(required("roleRef.name"))
    for i, subject in enumerate(obj.get("subjects") or []):
        at = f"subjects[{i}]"
        kind = subject.get("kind", "") if isinstance(subject, dict) else ""
        if kind not in _SUBJECT_KINDS:
            causes.append(unsupported(f"{at}.kind", kind, _SUBJECT_KINDS))
            continue
        if not subject.get("name"):
            causes.append(required(f"{at}.name"))
        if kind == "ServiceAccount" and cluster and not subject.get("namespace"):
            causes.append(required(f"{at}.namespace"))
    return causes


def role_ref_update(new: Obj, old: Obj) -> list[Cause]:
    if new.get("roleRef") != old.get("roleRef"):
        return [invalid("roleRef", new.get("roleRef"), "cannot change roleRef")]
    return []
